"""``python -m dsprof.runtime``: run the bundled decode runtime and write its artifacts.

Exit status 0 only when every rank finished and every token was returned.
Under torchrun (RANK/WORLD_SIZE set) this process runs one rank.
"""

from __future__ import annotations

import argparse
import sys

from dsprof.errors import DsprofError
from dsprof.runtime.config import METADATA_PATHS, PRESETS, RuntimeConfig
from dsprof.runtime.distributed import torchrun_env
from dsprof.runtime.processes import exit_status_of, signal_of


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dsprof.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="demo")
    for flag in ("ranks", "tp", "requests", "prompt-tokens", "output-tokens", "layers", "rounds", "warmup", "seed"):
        parser.add_argument(f"--{flag}", type=int, default=None)
    parser.add_argument("--metadata", choices=METADATA_PATHS, default=None)
    parser.add_argument(
        "--no-device-phases",
        dest="device_phases",
        action="store_false",
        default=None,
        help="do not emit device-phase markers (native_fence_wait, device_wall)",
    )
    parser.add_argument(
        "--inject",
        action="append",
        default=None,
        metavar="SPEC",
        help="inject a fault, e.g. fence_tail:p=0.05,ms=20 (repeatable; see docs/RUNTIME.md)",
    )
    parser.add_argument("--acceptance-rate", type=float, default=None, help="synthetic MTP acceptance rate")
    parser.add_argument("--profile-level", default=None, help="SA_PROFILE levels, e.g. e2e,kernel")
    parser.add_argument("--no-profile", dest="profile", action="store_false", default=None, help="switch SA_PROFILE and STRACE off")
    parser.add_argument(
        "--no-host-evidence",
        dest="host_evidence",
        action="store_false",
        default=None,
        help="STRACE spans without host evidence (os.cpu_ns, os.rq_ns, os.nivcsw, os.majflt)",
    )
    parser.add_argument(
        "--torch-profiler",
        dest="torch_profiler",
        action="store_true",
        default=None,
        help="also record a torch.profiler (Kineto) trace per rank in DIR/torch-profiler/",
    )
    parser.add_argument("-o", "--out", required=True, help="artifact directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    preset, out = args.pop("preset"), args.pop("out")
    try:
        config = RuntimeConfig.from_preset(preset, **args)
        launched = torchrun_env()
        if launched is not None:
            from dsprof.runtime.launch import run_torchrun_rank

            return run_torchrun_rank(config, out, *launched)
        from dsprof.runtime.launch import run_workload

        outcome = run_workload(config, out, progress=lambda text: print(text, file=sys.stderr, flush=True))
    except DsprofError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the ranks were stopped, the artifacts written
        print(f"interrupted by {signal_of(stop).name}: the ranks were stopped; what ran is in {out}", file=sys.stderr)
        return exit_status_of(stop)
    print(outcome.message, file=sys.stderr)
    return outcome.exit_status


if __name__ == "__main__":
    sys.exit(main())
