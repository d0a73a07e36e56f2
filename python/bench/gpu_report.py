"""The report of scripts/gpu.sh: gathers what a GPU call measured into $OUT/results.json and prints
a summary and one table (kiln ms, reference ms, kiln / reference, peak memory per row).

    python3 python/bench/gpu_report.py WORK OUT [--table]

WORK holds the driver's files: meta.json, parts.jsonl (one line per part: status, seconds), lce.json
and flex.json (python/bench/compare_torch.py), train.json (bench/train_bench.py), ops.jsonl
(bench_memory_bound / bench_matmul lines) and ab.jsonl (one line per A/B run, naming the file that
holds the run's output). OUT holds ctest.log and pytest.log. Anything missing is left out, so a call
cut short still gets a report of what it reached. Standard library only.
"""
import json
import os
import re
import sys

MiB = 1 << 20


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def row(suite, name, kiln_ms, ref_ms, ref, kiln_mib=None, ref_mib=None, note=""):
    return {"suite": suite, "row": name, "kiln_ms": kiln_ms, "ref_ms": ref_ms, "ref": ref,
            "ratio": kiln_ms / ref_ms if kiln_ms and ref_ms else None,
            "kiln_mib": kiln_mib, "ref_mib": ref_mib,
            "mem_ratio": kiln_mib / ref_mib if kiln_mib and ref_mib else None, "note": note}


def variant_error(v):
    for k in ("error", "fwd_bwd_error", "fwd_error"):
        if v.get(k):
            return v[k]
    return "not measured" if v.get("fwd_bwd_ms") is None else ""


# ---------------------------------------------------------------- suites

def lce_rows(data):
    rows = []
    for r in (data or {}).get("lce", []):
        s = r.get("shape", {})
        shape = f"{s.get('N')}x{s.get('H')}x{s.get('V')}"
        ref = r["variants"].get("torch_compile", {})
        for strategy in ("speed", "memory"):
            v = r["variants"].get(f"kiln_{strategy}", {})
            note = "; ".join(x for x in (variant_error(v), variant_error(ref) and "torch: " + variant_error(ref)) if x)
            rows.append(row("lce", f"{shape} {strategy}", v.get("fwd_bwd_ms"), ref.get("fwd_bwd_ms"), "torch.compile",
                            v.get("peak_extra_mib"), ref.get("peak_extra_mib"), note))
    return rows


def flex_name(s):
    mask = {"sliding": f"window {s.get('W')}", "causal": "causal", "document": f"{s.get('docs')} documents"}[s["mask"]]
    if s.get("score") == "alibi":
        mask += "+ALiBi"
    elif s.get("score") == "softcap":
        mask += "+softcap"
    return f"{s['B']}x{s['H']}x{s['S']}x{s['D']} {mask}"


def flex_rows(data):
    rows = []
    for r in (data or {}).get("flex", []):
        v, ref = r["variants"].get("kiln_flex", {}), r["variants"].get("torch_flex", {})
        note = "; ".join(x for x in (variant_error(v), variant_error(ref) and "torch: " + variant_error(ref)) if x)
        rows.append(row("flex", flex_name(r["shape"]), v.get("fwd_bwd_ms"), ref.get("fwd_bwd_ms"), "torch flex",
                        v.get("peak_extra_mib"), ref.get("peak_extra_mib"), note))
    return rows


def step_ms(r):
    return r["step_s_mean"] * 1e3 if r and r.get("step_s_mean") else None


def peak_mib(r):
    return r["peak_allocated_bytes"] / MiB if r and r.get("peak_allocated_bytes") else None


def train_rows(data):
    results = (data or {}).get("results", [])
    by = {r.get("framework"): r for r in results}
    kiln = by.get("kiln")
    rows = []
    for fw, ref_name in (("torch-eager", "torch eager"), ("torch-compile", "torch.compile")):
        if fw not in by and kiln is None:
            continue
        ref = by.get(fw, {})
        note = []
        for who, r in (("kiln", kiln or {}), (ref_name, ref)):
            if r.get("error"):
                note.append(f"{who}: {r['error'].strip().splitlines()[-1][:120] if r['error'].strip() else 'failed'}")
            elif r.get("tokens_per_s"):
                note.append(f"{who} {r['tokens_per_s']:,.0f} tok/s")
        rows.append(row("train", f"gpt125m step vs {ref_name}", step_ms(kiln), step_ms(ref), ref_name,
                        peak_mib(kiln), peak_mib(ref), ", ".join(note)))
    return rows


def parse_ctest(path):
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return None
    m = re.findall(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
    out = {"failed_tests": re.findall(r"^\s+\d+ - (\S+) \((?:Failed|Timeout|SEGFAULT|Subprocess[^)]*|Exception[^)]*)\)",
                                      text, re.M)[:50]}
    if m:
        _, failed, total = m[-1]
        out.update(total=int(total), failed=int(failed), passed=int(total) - int(failed))
    out["skipped"] = len(re.findall(r"\*\*\*Skipped", text))
    return out


def parse_pytest(path):
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return None
    out = {"failed_tests": [ln.split()[1] for ln in lines if ln.startswith(("FAILED ", "ERROR ")) and len(ln.split()) > 1]}
    for ln in reversed(lines):
        counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", ln))
        if counts:
            out.update(counts)
            out["summary"] = ln.strip("= ")
            break
    return out


# ---------------------------------------------------------------- A/B

def ab_times(run):
    """[(row suffix, kiln ms, peak MiB)] of one A/B run's output."""
    path = run.get("file", "")
    if run["suite"] == "train":
        data = read_json(path) or {}
        k = next((r for r in data.get("results", []) if r.get("framework") == "kiln"), None)
        return [("", step_ms(k), peak_mib(k))] if k and not k.get("error") else []
    out = []
    for line in read_jsonl(path):
        if run["suite"] == "flex" and line.get("variant") == "flex":
            peak = line.get("peak_extra_bytes")
            out.append(("", line.get("fwd_bwd_ms"), peak / MiB if peak else None))
        elif run["suite"] == "lce" and line.get("variant") in ("speed", "memory"):
            peak = line.get("peak_extra_bytes")
            out.append((" " + line["variant"], line.get("fwd_bwd_ms"), peak / MiB if peak else None))
    return out


def ab_table(runs):
    """{"var", "values", "rows": [{"row", "ms": {value: [per pass]}, "best": {value: ms}}]}."""
    if not runs:
        return None
    values, rows = [], {}
    for run in runs:
        if run["value"] not in values:
            values.append(run["value"])
        for suffix, ms, mib in ab_times(run):
            r = rows.setdefault(run["row"] + suffix, {"row": run["row"] + suffix, "ms": {}, "mib": {}})
            if ms is not None:
                r["ms"].setdefault(run["value"], []).append(ms)
            if mib is not None:
                r["mib"][run["value"]] = mib
    for r in rows.values():
        r["best"] = {v: min(ts) for v, ts in r["ms"].items()}
    return {"suite": runs[0]["suite"], "var": runs[0]["var"], "values": values, "rows": list(rows.values()),
            "failed_runs": [f"{r['row']} {r['var']}={r['value']} pass {r['pass']}: rc {r['rc']}" for r in runs if r["rc"]]}


# ---------------------------------------------------------------- output

def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_summary(res, out):
    m = res["meta"]
    print(f"kiln {m.get('commit')} on {m.get('gpu')} ({m.get('date')}): scripts/gpu.sh {m.get('argv')}", file=out)
    for p in res["parts"]:
        print(f"  {p['part']:<10} {p['status']:<8} {p['seconds']:>4} s  {p.get('note', '')}", file=out)
    c, t = res.get("ctest"), res.get("pytest")
    if c and "total" in c:
        print(f"  CTest {c['passed']} of {c['total']} passed, {c['skipped']} skipped"
              + (f"; failed: {' '.join(c['failed_tests'])}" if c["failed_tests"] else ""), file=out)
    if t and "summary" in t:
        print(f"  pytest {t['summary']}" + (f"; failed: {' '.join(t['failed_tests'])}" if t["failed_tests"] else ""),
              file=out)


def print_rows(rows, out):
    head = (f"{'suite':<6} {'row':<36} {'kiln ms':>9} {'ref ms':>9} {'kiln/ref':>8} {'kiln MiB':>9} {'ref MiB':>9}"
            f" {'mem':>5}  reference; notes")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        print(f"{r['suite']:<6} {r['row']:<36} {fmt(r['kiln_ms'], '.3f'):>9} {fmt(r['ref_ms'], '.3f'):>9} "
              f"{fmt(r['ratio'], '.2f'):>8} {fmt(r['kiln_mib'], '.0f'):>9} {fmt(r['ref_mib'], '.0f'):>9} "
              f"{fmt(r['mem_ratio'], '.2f'):>5}  {r['ref']}{'; ' + r['note'] if r['note'] else ''}", file=out)


def print_ab(ab, out):
    vals = ab["values"]
    print(f"A/B of {ab['var']} on {ab['suite']}: kiln's fwd+bwd ms (train: step ms), best of the passes; "
          f"ratio = each value / {vals[0]}", file=out)
    head = f"{'row':<36} " + " ".join(f"{v[:12]:>12}" for v in vals) + " " + " ".join(
        f"{('/' + v)[:10]:>10}" for v in vals[1:])
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in ab["rows"]:
        b = r["best"]
        base = b.get(vals[0])
        print(f"{r['row']:<36} " + " ".join(f"{fmt(b.get(v), '.3f'):>12}" for v in vals) + " " + " ".join(
            f"{fmt(b[v] / base if base and b.get(v) else None, '.3f'):>10}" for v in vals[1:]), file=out)
    for f in ab["failed_runs"]:
        print(f"  failed: {f}", file=out)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    work, out_dir = argv[0], argv[1]
    res = {"meta": read_json(os.path.join(work, "meta.json")) or {},
           "parts": read_jsonl(os.path.join(work, "parts.jsonl")),
           "ctest": parse_ctest(os.path.join(out_dir, "ctest.log")),
           "pytest": parse_pytest(os.path.join(out_dir, "pytest.log"))}
    raw = {k: read_json(os.path.join(work, f"{k}.json")) for k in ("lce", "flex", "train")}
    res["rows"] = lce_rows(raw["lce"]) + flex_rows(raw["flex"]) + train_rows(raw["train"])
    res["ab"] = ab_table(read_jsonl(os.path.join(work, "ab.jsonl")))
    res["ops"] = read_jsonl(os.path.join(work, "ops.jsonl")) or None
    res["raw"] = raw
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    if "--table" in argv:
        print_summary(res, sys.stdout)
        print(file=sys.stdout)
        if res["ab"]:
            print_ab(res["ab"], sys.stdout)
        if res["rows"]:
            print_rows(res["rows"], sys.stdout)
        elif not res["ab"]:
            print("no benchmark rows", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
