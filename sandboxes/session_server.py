"""The stateful interpreter's server, run by the agent as ``python3 -u -c <this> REQ_FD RESP_FD``.

Cells arrive as JSON lines on REQ_FD and run in one namespace that lives as long as the process
(like a notebook); a last expression's repr is printed. The cell's stdout/stderr are the process's
own (the agent captures and caps them); the reply on RESP_FD carries success and resource use.
Standard library only: it runs inside the sandbox.
"""

import ast
import json
import os
import resource
import sys
import traceback


def run_cell(code, namespace):
    tree = ast.parse(code, "<cell>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def report(exc):
    """Print the cell's traceback without this server's own frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<cell>"]
    if frames:
        sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)))
    sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))


def main():
    requests = os.fdopen(int(sys.argv[1]), "rb")
    resp_fd = int(sys.argv[2])
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for line in requests:
        request = json.loads(line)
        if request.get("ping"):  # the agent checks we are alive before trusting us with a cell
            os.write(resp_fd, b'{"pong": true}\n')
            continue
        before = resource.getrusage(resource.RUSAGE_SELF)
        ok = True
        try:
            run_cell(request["code"], namespace)
        except BaseException as exc:  # the cell's error (even SystemExit) is its result; the session lives on
            ok = isinstance(exc, SystemExit) and exc.code in (None, 0)
            if not ok:
                report(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        reply = {"ok": ok, "cpu_s": cpu, "peak_mem_bytes": after.ru_maxrss * 1024}
        os.write(resp_fd, (json.dumps(reply) + "\n").encode())


if __name__ == "__main__":
    main()
