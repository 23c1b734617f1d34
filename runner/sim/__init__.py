"""vllm-sim: a stand-in for `vllm serve` on machines without a GPU.

It takes `vllm serve`'s command line, writes vLLM 0.33's log, serves its HTTP API and fails the way a
fault scenario (VLLM_SIM_SCENARIO) says, faster by VLLM_SIM_SPEED. It is a test double for a GPU and a
model: the product launches it exactly as it launches vLLM and cannot tell the difference.
"""
