#!/usr/bin/env python3
"""The last full decode step of a profile, by kernel (tools/device_profile.sh).

  profile_step.py ktrace FILE   tools/ktrace.c's CSV: kernels as the step ran
                                them (graphs, PDL). Per kernel, what it added
                                to the step's end: its end past every earlier
                                kernel's end (overlapped work adds nothing),
                                and the idle time before it started.
  profile_step.py ncu FILE      ncu --csv --metrics gpu__time_duration.sum:
                                each kernel alone, summed.
A step is the kernels after one k_sample launch up to the next."""
import csv
import re
import sys


def short(name):
    m = re.match(r"_Z(\d+)", name)  # a mangled name: its identifier
    if m:
        n = int(m.group(1))
        return name[len(m.group(0)):len(m.group(0)) + n]
    return re.sub(r"\(.*", "", name).replace("void ", "")[:60]


def last_step(names):
    cut = [j for j, n in enumerate(names) if n == "k_sample"]
    if len(cut) < 2:
        sys.exit("profile_step: fewer than two k_sample launches")
    return cut[-2], cut[-1]


def top(agg, cols, title):
    print(title)
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1][1])[:32]:
        print("".join(f(v) for f in cols) + "  " + k)


def ktrace(path):
    rows = sorted(csv.DictReader(open(path)), key=lambda r: int(r["start_ns"]))
    names = [short(r["name"]) for r in rows]
    a, b = last_step(names)
    front = int(rows[a]["end_ns"])  # the previous step's last kernel
    t0, busy, idle, agg = front, 0, 0, {}
    for r, n in zip(rows[a + 1:b + 1], names[a + 1:b + 1]):
        s, e = int(r["start_ns"]), int(r["end_ns"])
        gap = max(0, s - front)
        add = max(0, e - front)
        front = max(front, e)
        busy += e - s
        idle += gap
        k = f"{n} ({r['gx']},{r['gy']},{r['gz']})x{r['bx']}"
        c = agg.setdefault(k, [0, 0, 0, 0])
        c[0] += 1; c[1] += add; c[2] += e - s; c[3] += gap
    span = front - t0
    print(f"decode step: {b - a} kernels, {span / 1e3:.1f} us end to end; kernels' own spans sum to "
          f"{busy / 1e3:.1f} us; the GPU ran no kernel for {idle / 1e3:.1f} us of it")
    top(agg, [lambda v: f"{v[1] / 1e3:9.1f} us added", lambda v: f" {v[0]:4d}x",
              lambda v: f" {v[2] / v[0] / 1e3:7.2f} us each", lambda v: f" idle before {v[3] / 1e3:6.1f}"],
        "   added      count   own span     idle  kernel (grid)x block")


def ncu(path):
    txt = open(path, errors="replace").read()
    rows = list(csv.DictReader(txt[txt.find('"ID"'):].splitlines()))
    names = [short(r["Kernel Name"]) for r in rows]
    a, b = last_step(names)
    agg, tot = {}, 0.0
    for r, n in zip(rows[a + 1:b + 1], names[a + 1:b + 1]):
        t = float(r["Metric Value"].replace(",", ""))
        c = agg.setdefault(f"{n} {r['Grid Size']}", [0, 0.0])
        c[0] += 1; c[1] += t; tot += t
    print(f"decode step: {b - a} kernels, {tot / 1e3:.1f} us (each alone, base clocks)")
    top(agg, [lambda v: f"{v[1] / 1e3:9.1f} us", lambda v: f" {v[0]:4d}x", lambda v: f" {v[1] / v[0] / 1e3:7.2f} us"],
        "   total      count   each    kernel grid")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("ktrace", "ncu"):
        sys.exit(__doc__)
    {"ktrace": ktrace, "ncu": ncu}[sys.argv[1]](sys.argv[2])
