"""vllm-sim: a stand-in for `vllm serve` on machines without a GPU.

It takes `vllm serve`'s command line, writes vLLM 0.32's log, serves its HTTP API and fails the way a
fault scenario (VLLM_SIM_SCENARIO) says, faster by VLLM_SIM_SPEED. It is a test double for a GPU and a
model: the product launches it exactly as it launches vLLM and cannot tell the difference. Where it
and the real server differ, it is wrong: tests/test_sim_follows_real.py compares it with vLLM's CPU build.
"""
