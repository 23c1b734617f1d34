"""The simulated numbers: memory, KV-cache capacity, phase durations, and the faults they imply.

vLLM's own arithmetic, simplified: the weights are split over the TP ranks, the KV cache gets what is
left of `gpu_memory_utilization` after weights, activations and CUDA graphs, and when that does not
add up vLLM fails by itself. The simulator does the same, so a scenario can cause those failures by
describing the host and the model instead of naming an error.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass

from vllm_sim.datafiles import load
from vllm_sim.scenario import Scenario
from vllm_sim.settings import Settings

GIB = 1 << 30


@dataclass(frozen=True)
class Facts:
    settings: Settings
    scenario: Scenario
    weights_per_gpu_gib: float
    requested_gib: float  # gpu_memory_utilization of a GPU
    free_gib: float  # what other processes left free
    kv_gib: float  # KV-cache memory per GPU
    kv_bytes_per_token: float  # per GPU, in the KV-cache dtype
    num_gpu_blocks: int
    kv_tokens: int
    max_model_len: int  # after auto-fit
    max_num_seqs: int
    max_num_batched_tokens: int
    phase_seconds: dict[str, float]
    launch: int = 0  # which launch of the run this is: flaky faults draw per launch

    @property
    def multiproc(self) -> bool:
        return self.settings.tensor_parallel_size > 1

    def conditions(self) -> frozenset[str]:
        """Names the log and the catalog use to say when a line or an error applies."""
        found = {"eager" if self.settings.enforce_eager else "compiled"}
        if self.multiproc:
            found.add("multiproc")
        if self.settings.load_format in load("log.toml")["load_format_bars"]:
            found.add("shards")
        if self.scenario.model.moe_experts:
            found.add("moe")
        if self.settings.auto_fit:
            found.add("autofit_reduced" if self.max_model_len < self.scenario.model.max_model_len else "autofit_full")
        return frozenset(found)

    def natural_errors(self) -> list[str]:
        """Errors real vLLM would raise with these numbers, in the order it would meet them."""
        errors = []
        if self.settings.tensor_parallel_size > self.scenario.host.gpu_count:
            errors.append("world_size_exceeds_gpus")
        if self.free_gib < self.requested_gib:
            errors.append("free_memory_less_than_desired")
        if self.weights_per_gpu_gib >= self.free_gib:
            errors.append("weight_load_oom")
        if self.kv_gib <= 0:
            errors.append("no_kv_cache_memory")
        elif self.max_model_len > self.kv_tokens:
            errors.append("max_model_len_exceeds_kv_cache")
        return errors

    def values(self) -> dict[str, object]:
        """The names `{...}` in log and error texts can use."""
        settings, host, model = self.settings, self.scenario.host, self.scenario.model
        log_values = load("log.toml")["values"]
        init, load_s = self.phase_seconds["engine_init"], self.phase_seconds["weight_load"]
        host_part = f"[{settings.host}]" if ":" in settings.host else settings.host
        seed = f"{settings.model}|{settings.tensor_parallel_size}|{settings.port}".encode()
        digest = hashlib.sha256(seed).hexdigest()
        return {
            **log_values,
            "version": self.scenario.image.vllm,
            "api_pid": os.getpid(),
            "model": settings.model,
            "served_model_name": settings.served_model_name,
            "non_default_args": repr(settings.non_default_args),
            "architecture": model.architecture,
            "dtype": model.dtype,
            "trust_remote_code": settings.trust_remote_code,
            "load_format": settings.load_format,
            "quantization": settings.quantization,
            "enforce_eager": settings.enforce_eager,
            "kv_cache_dtype": settings.kv_cache_dtype,
            "enable_prefix_caching": settings.enable_prefix_caching,
            "block_size": settings.block_size,
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "compilation_config": log_values["compilation_eager" if settings.enforce_eager else "compilation_compiled"],
            "tp": settings.tensor_parallel_size,
            "url": f"http://{host_part}:{settings.port}",
            "dist_port": 20000 + int(digest[:8], 16) % 40000,
            "compile_hash": digest[8:18],
            "nccl_version": host.nccl_version,
            "cuda_driver_version": host.cuda_version_number,
            "gpu_count": host.gpu_count,
            "device_name": host.gpu_name.replace(" ", "_"),
            "gpu_memory_gib": host.gpu_memory_gib,
            "free_gib": self.free_gib,
            "requested_gib": self.requested_gib,
            "oom_in_use_gib": host.gpu_memory_gib - host.foreign_memory_gib - 1.19,
            "oom_allocated_gib": host.gpu_memory_gib - host.foreign_memory_gib - 2.41,
            "attention_backend": model.attention_backend,
            "attention_backends": repr(list(model.attention_backends)),
            "num_shards": model.num_shards,
            "moe_experts": model.moe_experts,
            "moe_n": model.moe_intermediate_size // settings.tensor_parallel_size,
            "shard_bar": load("log.toml")["load_format_bars"].get(settings.load_format, ""),
            "weights_per_gpu_gib": self.weights_per_gpu_gib,
            "weights_load_s": 0.92 * load_s,
            "model_load_s": 0.99 * load_s,
            "dynamo_s": 0.13 * init,
            "compile_graph_s": 0.37 * init,
            "compile_s": 0.5 * init,
            "warmup_s": 0.05 * init,
            "graph_s": 0.28 * init,
            "cudagraph_gib": model.cudagraph_gib,
            "engine_init_s": init,
            "kv_gib": self.kv_gib,
            "kv_tokens": self.kv_tokens,
            "num_gpu_blocks": self.num_gpu_blocks,
            "model_max_len": model.max_model_len,
            "config_max_model_len": settings.max_model_len or model.max_model_len,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.kv_tokens / self.max_model_len if self.max_model_len else 0.0,
            "needed_kv_gib": self.max_model_len * self.kv_bytes_per_token / GIB,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "bind_errno": 98,
            "bind_strerror": "Address already in use",
        }


def compute_facts(settings: Settings, scenario: Scenario, launch: int = 0) -> Facts:
    host, model, timings = scenario.host, scenario.model, scenario.timings
    tp = settings.tensor_parallel_size
    element_bytes = float(load("defaults.toml")["kv_cache_dtype_bytes"][settings.kv_cache_dtype])
    per_token = model.kv_bytes_per_token * element_bytes / 2 / (1 if model.kv_replicated else tp)
    weights = model.weights_gib / tp
    requested = host.gpu_memory_gib * settings.gpu_memory_utilization
    graphs = 0.0 if settings.enforce_eager else model.cudagraph_gib
    kv_gib = requested - weights - model.activation_gib - graphs
    blocks = max(0, math.floor(kv_gib * GIB / (per_token * settings.block_size)))
    kv_tokens = blocks * settings.block_size
    if settings.auto_fit:
        max_len = min(model.max_model_len, kv_tokens)
    else:
        max_len = settings.max_model_len or model.max_model_len
    big_gpu, mid_gpu = host.gpu_memory_gib >= 160, host.gpu_memory_gib >= 70  # EngineArgs.get_batch_defaults
    return Facts(
        settings=settings,
        scenario=scenario,
        weights_per_gpu_gib=weights,
        requested_gib=requested,
        free_gib=host.gpu_memory_gib - host.foreign_memory_gib,
        kv_gib=kv_gib,
        kv_bytes_per_token=per_token,
        num_gpu_blocks=blocks,
        kv_tokens=kv_tokens,
        max_model_len=max_len,
        max_num_seqs=settings.max_num_seqs or (1024 if mid_gpu else 256),
        max_num_batched_tokens=settings.max_num_batched_tokens or (16384 if big_gpu else 8192 if mid_gpu else 2048),
        phase_seconds={
            "gpu_detect": timings.gpu_detect,
            "weight_load": timings.weight_load_dummy if settings.load_format == "dummy" else timings.weight_load,
            "engine_init": timings.engine_init_eager if settings.enforce_eager else timings.engine_init,
            "api_listen": timings.api_listen,
        },
        launch=launch,
    )
