"""Configuration of the bundled decode runtime: presets and validation.

``RuntimeConfig.from_preset(name, **overrides)`` is what ``dsprof run`` and
``python -m dsprof.runtime`` build; every value is checked once here so rank
processes never start with a shape they cannot serve.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from dsprof.errors import DsprofError
from dsprof.runtime.faults import parse_faults

METADATA_PATHS = ("host-shared", "device-resident")
# How a collective's wait learns its ``peer`` (the last rank to arrive): "stamps" exchanges the ranks'
# arrival times with the collective (one host clock: the CPU device); "waits" exchanges each
# wait's length after the run (the last to arrive waited least: CUDA, where no host clock sees
# the stream arrive); "auto" is stamps on CPU, waits on CUDA.
PEER_SOURCES = ("auto", "stamps", "waits")
PROFILE_LEVELS = ("e2e", "kernel", "verbose")
PIPELINE_DEPTH = 2  # async depth of the chip-run lane (ping-pong slots)


@dataclass(frozen=True)
class RuntimeConfig:
    """One workload of the bundled runtime (shape, parallelism, profiling, faults).

    ``rounds=None`` serves every request to completion (serving presets);
    ``rounds=N`` runs exactly ``warmup + N`` decode steps of the fused decode
    program (microbenchmark), and only the N measured rounds are profiled.
    """

    preset: str = "demo"
    ranks: int = 4
    tp: int = 1
    requests: int = 16
    prompt_tokens: int = 32
    output_tokens: int = 48
    layers: int = 2
    rounds: int | None = None
    warmup: int = 0
    metadata: str = "host-shared"
    device_phases: bool = True
    inject: list[str] = field(default_factory=list)
    seed: int = 0
    acceptance_rate: float = 0.79
    profile_level: str = "e2e,kernel"
    profile: bool = True
    # Host evidence on the STRACE spans (docs/FORMATS.md "Host evidence": os.cpu_ns, os.rq_ns, ...); its
    # cost is measured by benchmarks/bench_runtime.py and well under 5%.
    host_evidence: bool = True
    # A torch.profiler (Kineto) trace per rank beside STRACE (docs/RUNTIME.md "torch.profiler traces")
    torch_profiler: bool = False
    peer_source: str = "auto"  # PEER_SOURCES
    # model shape (small on purpose: the runtime must run on a 2-core CPU)
    hidden: int = 64
    heads: int = 4
    kv_latent: int = 32
    vocab: int = 512
    experts_per_rank: int = 2
    top_k: int = 2
    expert_hidden: int = 64
    block_size: int = 16
    # Modelled latency of one synchronous host-to-device copy on the CPU
    # "device" (the device-resident metadata path pays it per metadata buffer).
    copy_latency_ms: float = 4.0

    @property
    def dp(self) -> int:
        return self.ranks // self.tp

    @property
    def ep(self) -> int:
        return self.ranks

    @property
    def depth(self) -> int:
        return PIPELINE_DEPTH

    @property
    def dense_layers(self) -> int:
        """Leading dense layers (DeepSeek keeps the first layers dense); the rest are MoE."""
        return 1 if self.layers > 1 else 0

    @classmethod
    def from_preset(cls, name: str = "demo", **overrides) -> RuntimeConfig:
        """The named preset with ``overrides`` applied (None values are ignored)."""
        if name not in PRESETS:
            raise DsprofError(f"unknown preset {name!r} (expected one of {', '.join(PRESETS)})")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise DsprofError(f"unknown runtime option(s): {', '.join(unknown)}")
        values = {k: v for k, v in overrides.items() if v is not None}
        if "inject" in values:
            values["inject"] = list(values["inject"])
        config = replace(PRESETS[name], **values)
        if name == "microbench" and "output_tokens" not in values:
            # Requests never finish inside the measured window: every round decodes.
            config = replace(config, output_tokens=2 * (config.warmup + (config.rounds or 0)) + 2)
        config.validate()
        return config

    def validate(self) -> None:
        """Raise DsprofError naming the first bad value."""

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise DsprofError(f"invalid runtime config: {what}")

        for name in (
            "ranks",
            "tp",
            "requests",
            "prompt_tokens",
            "output_tokens",
            "layers",
            "hidden",
            "heads",
            "kv_latent",
            "vocab",
            "experts_per_rank",
            "top_k",
            "expert_hidden",
            "block_size",
        ):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"{name} must be a positive integer, got {value!r}")
        need(self.ranks <= 64, f"ranks must be at most 64, got {self.ranks}")
        need(self.ranks % self.tp == 0, f"tp={self.tp} must divide ranks={self.ranks}")
        need(self.heads % self.tp == 0, f"tp={self.tp} must divide heads={self.heads}")
        need(self.expert_hidden % self.tp == 0, f"tp={self.tp} must divide expert_hidden={self.expert_hidden}")
        need(self.requests >= self.dp, f"requests={self.requests} must be at least dp={self.dp} (one per DP group)")
        need(self.hidden % self.heads == 0, f"heads={self.heads} must divide hidden={self.hidden}")
        need(self.top_k <= self.experts_per_rank * self.ranks, "top_k exceeds the number of experts")
        need(self.output_tokens >= 1, "output_tokens must be at least 1")
        need(
            self.rounds is None or (isinstance(self.rounds, int) and self.rounds >= 1),
            f"rounds must be a positive integer, got {self.rounds!r}",
        )
        need(isinstance(self.warmup, int) and self.warmup >= 0, f"warmup must be >= 0, got {self.warmup!r}")
        need(self.peer_source in PEER_SOURCES, f"peer_source must be one of {', '.join(PEER_SOURCES)}, got {self.peer_source!r}")
        need(self.metadata in METADATA_PATHS, f"metadata must be one of {', '.join(METADATA_PATHS)}, got {self.metadata!r}")
        need(0.0 <= self.acceptance_rate <= 1.0, f"acceptance_rate must be in [0, 1], got {self.acceptance_rate}")
        need(self.copy_latency_ms >= 0, "copy_latency_ms must be >= 0")
        levels = [lv.strip() for lv in self.profile_level.split(",") if lv.strip()]
        bad = [lv for lv in levels if lv not in PROFILE_LEVELS]
        need(bool(levels) and not bad, f"profile_level must be a comma list of {', '.join(PROFILE_LEVELS)}, got {self.profile_level!r}")
        parse_faults(self.inject, self.ranks)

    def workload(self) -> dict:
        """The ``workload`` block of performance_summary.json."""
        data = asdict(self)
        data.update(
            dp=self.dp,
            ep=self.ep,
            depth=self.depth,
            dense_layers=self.dense_layers,
            moe_layers=self.layers - self.dense_layers,
            experts=self.experts_per_rank * self.ranks,
            mtp=1,
        )
        return data


PRESETS: dict[str, RuntimeConfig] = {
    # dsprof run's default: every feature visible in well under a minute on 2 cores.
    "demo": RuntimeConfig(preset="demo", ranks=4, tp=1, requests=16, prompt_tokens=32, output_tokens=48),
    # The production shape (docs/RUNTIME.md) (GBS32 = DP8 x 4, EP8, TP1, 32 x 64 x 256) with a small model.
    "production": RuntimeConfig(preset="production", ranks=8, tp=1, requests=32, prompt_tokens=64, output_tokens=256),
    # The microbenchmark shape (docs/RUNTIME.md): EP4/TP4 on four ranks, 5 warm-up + 1000 measured rounds.
    "microbench": RuntimeConfig(preset="microbench", ranks=4, tp=4, requests=4, prompt_tokens=16, output_tokens=1, rounds=1000, warmup=5),
}
