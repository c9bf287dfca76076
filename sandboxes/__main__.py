"""``python -m agentrl.sandboxes build|run FILE|clean|doctor``: the sandbox commands before/without the CLI."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.sandboxes", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the Docker sandbox image (cached by recipe hash)")
    build.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    run = commands.add_parser("run", help="run FILE in a fresh sandbox and print the result")
    run.add_argument("file")
    run.add_argument("--backend", default="auto", help="auto, or a registered backend (docker, bwrap)")
    run.add_argument("--timeout", type=float, default=10.0)
    run.add_argument("--json", action="store_true", help="print the ExecResult as JSON")
    commands.add_parser("clean", help="remove every agentrl sandbox container on the engine")
    doctor = commands.add_parser("doctor", help="measure which limits each backend enforces on this host")
    doctor.add_argument("--backends", default="docker,bwrap", help="comma-separated backends to check")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)

    from agentrl.errors import ConfigError, SandboxError

    try:
        if args.command == "build":
            from agentrl.sandboxes import build_image

            print(build_image(force=args.force))
            return 0
        if args.command == "doctor":
            from agentrl.sandboxes.doctor import main as doctor_main

            return doctor_main(args.backends.split(","), as_json=args.json)
        if args.command == "clean":
            from agentrl.sandboxes.docker_backend import remove_all_sandboxes

            print(f"removed {remove_all_sandboxes()} sandbox container(s)")
            return 0
        from agentrl.sandboxes import run_file

        result = run_file(args.file, backend=args.backend, timeout=args.timeout)
    except (ConfigError, SandboxError, OSError) as exc:  # ConfigError: a backend the registry lacks
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.timed_out:
            print(f"[timed out after {args.timeout} s]", file=sys.stderr)
        if result.oom_killed:
            print("[killed: out of memory]", file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
