#!/usr/bin/env python3
"""Per-test comparison of a peer's own test suite run on kernel sockets and
under `tcps run` (tests/suites.sh).

  compare.py tap   KERNEL_DIR TCPS_DIR [KERNEL2_DIR]   nginx-tests: DIR/<file>.tap
  compare.py redis KERNEL_DIR TCPS_DIR [KERNEL2_DIR]   redis: DIR/<unit>.log (runtest output)

A test is identified by its file and number (nginx-tests' TAP) or by its unit,
name and occurrence (redis' `[ok]: name` lines). It counts as passing on the
kernel only if it passed in every kernel run given: KERNEL2_DIR holds a second
kernel run of the files that had a candidate regression, and a file missing
there was not run again (its first run stands). Prints the counts and every
regression (passed on the kernel, not under tcps) with what tcps' side said;
exits 1 if there is any. `--candidates` prints only the files with a
regression, one a line (for the second kernel run), and exits 0.
"""
import os
import re
import sys

TAP_LINE = re.compile(r"^(not )?ok (\d+)\b\s*-?\s*(.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
REDIS_LINE = re.compile(r"^\[(ok|err|exception|skip|ignore|timeout)\]: (.*?)(?: \(\d+ ms\))?$")


def parse_tap(path):
    """{test number: (passed, description, diagnostic lines)} of one TAP file."""
    tests, last = {}, None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = TAP_LINE.match(line)
            if m:
                desc = m.group(3)
                directive = re.search(r"#\s*(skip|todo)\b", desc, re.I)
                passed = m.group(1) is None and directive is None
                last = int(m.group(2))
                tests[last] = (passed, desc, [])
            elif last is not None and line.startswith("#") and len(tests[last][2]) < 8:
                tests[last][2].append(line)
    return tests


def parse_redis(path):
    """{(name, occurrence): (passed, name, detail lines)} of one runtest log."""
    tests, seen, last = {}, {}, None
    with open(path, errors="replace") as f:
        for line in f:
            line = ANSI.sub("", line.rstrip("\n"))
            m = REDIS_LINE.match(line)
            if m:
                name = m.group(2)
                seen[name] = seen.get(name, 0) + 1
                last = (name, seen[name])
                tests[last] = (m.group(1) == "ok", name, [line])
            elif last is not None and line and len(tests[last][2]) < 6 and not line.startswith("["):
                tests[last][2].append(line)
    return tests


def load(kind, directory):
    """{file or unit: parsed tests} of one run; {} when the directory is absent."""
    if not directory or not os.path.isdir(directory):
        return {}
    ext = ".tap" if kind == "tap" else ".log"
    parse = parse_tap if kind == "tap" else parse_redis
    return {n[: -len(ext)]: parse(os.path.join(directory, n))
            for n in sorted(os.listdir(directory)) if n.endswith(ext)}


def tail(directory, name, ext, lines=4):
    """The last lines of a run's output, for a test that never ran."""
    try:
        with open(os.path.join(directory, name + ext), errors="replace") as f:
            out = [ANSI.sub("", l.rstrip()) for l in f if l.strip()]
        return out[-lines:]
    except OSError:
        return ["(no output)"]


def main():
    args = [a for a in sys.argv[1:] if a != "--candidates"]
    only_candidates = "--candidates" in sys.argv
    if len(args) < 3 or args[0] not in ("tap", "redis"):
        sys.exit(__doc__)
    kind, kdir, tdir = args[:3]
    k2dir = args[3] if len(args) > 3 else None
    kernel, tcps, kernel2 = load(kind, kdir), load(kind, tdir), load(kind, k2dir)
    ext = ".tap" if kind == "tap" else ".log"
    regressions, flaky, kpass, tpass = [], 0, 0, 0
    for name, ktests in kernel.items():
        ttests = tcps.get(name, {})
        for key, (passed, desc, _) in ktests.items():
            if not passed:
                continue
            if name in kernel2 and not kernel2[name].get(key, (False,))[0]:
                flaky += 1
                continue
            kpass += 1
            t = ttests.get(key)
            if t and t[0]:
                tpass += 1
                continue
            what = t[2] if t else ["not run under tcps; the file's last lines:"] + tail(tdir, name, ext)
            regressions.append((name, key, desc, what))
    if only_candidates:
        for name in sorted({r[0] for r in regressions}):
            print(name)
        return 0
    unit = "files" if kind == "tap" else "units"
    print(f"{len(kernel)} {unit}; {kpass} tests passed on kernel sockets"
          f"{f' (and {flaky} more passed only one of two kernel runs: not counted)' if flaky else ''}; "
          f"{tpass} of them passed under tcps")
    for name, key, desc, what in regressions:
        ident = f"{name}.t test {key}" if kind == "tap" else f"{name}: {key[0]!r}" + (f" (#{key[1]})" if key[1] > 1 else "")
        print(f"REGRESSION {ident}: {desc}" if kind == "tap" else f"REGRESSION {ident}")
        for line in what:
            print(f"    {line}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
