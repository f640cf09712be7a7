"""Issue 39's goals, read from the rows of experiments/worlds_learned.py, and its markdown."""

from __future__ import annotations

import math

from study import fmt

GOAL_EXCESS = {"autoregressive": 0.05, "masked": 0.10, "block": 0.10, "gaussian": 0.20}
BASE = ("autoregressive", "masked", "block", "gaussian")


def pick(rows: list[dict], **match) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def num(x) -> float:
    """A JSON figure as a float ('inf' strings included)."""
    return float(x) if x is not None else math.nan


def one_se(row: dict) -> float:
    """One sample set's standard error of the KL rate (the floor's spread over its sets)."""
    return row["kl_floor_se"] * math.sqrt(8)


def models(rows: list[dict]) -> list[dict]:
    """One row per trained model (its bound and context figures)."""
    seen, out = set(), []
    for r in rows:
        key = (r["world"], r["model"], r["role"])
        if r["role"] == "trained" and key not in seen and "excess_bits" in r:
            seen.add(key)
            out.append(r)
    return out


def still_learning(curve: list[tuple[int, float]], goal: float) -> str:
    """From the last quarter of a validation curve: still falling, and steps to the goal at
    that rate (a straight line: optimistic for a curve that flattens)."""
    if not curve:
        return "none (the gaussian run validates its training loss, not its bound)"
    if len(curve) < 4:
        return "too few validations to say"
    tail = curve[-max(3, len(curve) // 4) :]
    (s0, e0), (s1, e1) = tail[0], tail[-1]
    slope = (e1 - e0) / max(s1 - s0, 1)
    if slope >= 0:
        return "flat or rising at the end"
    if e1 <= goal:
        return "at the goal"
    return f"falling {-slope * 100:.3f} bits per 100 steps: ~{(e1 - goal) / -slope:.0f} more steps at that rate"


def goals(report: dict) -> list[str]:
    rows, out = report["rows"], []
    for m in models(rows):
        goal = GOAL_EXCESS.get(m["model"])
        if goal is None or m["world"] != "chars":
            continue
        curve = report["curves"].get(f"chars/{m['model']}", [])
        verdict = "met" if m["excess_bits"] <= goal else f"missed by {m['excess_bits'] - goal:.3f}"
        out.append(f"Learning, {m['model']} (chars): excess over the oracle's bound "
                   f"{m['excess_bits']:.3f} bits/token after {m['train_steps']} steps (goal <= {goal}): "
                   f"{verdict}; its validation curve: {still_learning(curve, goal)}.")  # fmt: skip
    for m in models(rows):
        if "context_gain" in m and m["world"] == "chars":
            ratio = m["context_gain"] / m["oracle_context_gain"]
            share = (m["context_gain"] - 1) / max(m["oracle_context_gain"] - 1, 1e-9)
            hi = max((t for t in (0.5, 0.7, 0.8, 0.9, 0.95, 0.99) if f"oracle_context_gain_t{t:g}" in m),
                     key=lambda t: m[f"oracle_context_gain_t{t:g}"], default=0.9)  # fmt: skip
            g, o = m[f"context_gain_t{hi:g}"], m[f"oracle_context_gain_t{hi:g}"]
            out.append(f"Context, {m['model']} (chars): gain at t = 0.8 {m['context_gain']:.3f} against "
                       f"the exact posterior's {m['oracle_context_gain']:.3f} on its table: {ratio:.2f}x "
                       f"(goal >= 0.8x: {'met' if ratio >= 0.8 else 'missed'}), but only {share:.0%} of "
                       f"the exact gain above 1; at t = {hi:g}, where the exact gain is largest, "
                       f"{g:.3f} against {o:.3f} ({(g - 1) / max(o - 1, 1e-9):.0%} of it).")  # fmt: skip
    for world in ("chars", "agreement"):
        best = {}
        for p in ("masked", "gaussian"):
            found = pick(rows, world=world, model=p, role="trained", steps=64)
            found = [r for r in found if "kind" not in r and "kl_rate" in r]
            if found:
                best[p] = min(found, key=lambda r: num(r["kl_rate"]))
        if len(best) == 2:
            g, m = best["gaussian"], best["masked"]
            ok = num(g["kl_rate"]) <= num(m["kl_rate"])
            out.append(f"Samples at 64 steps ({world}): best gaussian {g['sampler']} KL rate "
                       f"{fmt(g['kl_rate'], 4)} against best masked {m['sampler']} {fmt(m['kl_rate'], 4)}: "
                       f"{'met' if ok else 'missed'}.")  # fmt: skip
    out += speed_goals(rows)
    out += distil_goals(rows)
    out += crossover_goals(report["crossover"], report.get("crossover_bounds", []))
    return out


def speed_goals(rows: list[dict]) -> list[str]:
    out = []
    for world in ("chars", "agreement"):
        spec = [r for r in pick(rows, world=world, model="block", sampler="speculative")
                if "kind" not in r]  # fmt: skip
        if spec:
            s = spec[0]
            ratio = s["accepted_per_call"] / s["oracle_accepted_per_call"]
            out.append(f"Speculative ({world}): the learned block model commits "
                       f"{s['accepted_per_call']:.2f} tokens per call against the oracle drafter's "
                       f"{s['oracle_accepted_per_call']:.2f} ({ratio:.2f}x; goal >= 0.8x): "
                       f"{'met' if ratio >= 0.8 else 'missed'}.")  # fmt: skip
        ar = [
            r
            for r in pick(rows, world=world, model="autoregressive", sampler="AR")
            if "kind" not in r
        ]
        ar_speed = pick(rows, world=world, model="autoregressive", kind="speed", batch=1)
        if not (ar and ar_speed):
            continue
        ceiling = num(ar[0]["kl_rate"]) + 2 * one_se(ar[0])
        base = ar_speed[0]["tokens_per_s_median"]
        best = None
        for s in [r for r in rows if r.get("world") == world and r.get("kind") == "speed"
                  and r.get("batch") == 1 and r["model"] in ("masked", "block", "gaussian")]:  # fmt: skip
            scored = [r for r in pick(rows, world=world, model=s["model"], sampler=s["sampler"],
                                      steps=s["steps"], role="trained") if "kind" not in r]  # fmt: skip
            if scored and num(scored[0]["kl_rate"]) <= ceiling:
                if best is None or s["tokens_per_s_median"] > best[0]["tokens_per_s_median"]:
                    best = (s, scored[0])
        if best is None:
            out.append(f"Speed at AR's quality ({world}): no diffusion row has a KL rate within AR's "
                       f"{num(ar[0]['kl_rate']):.4f} + 2 SE = {ceiling:.4f}: missed.")  # fmt: skip
        else:
            s, k = best
            ratio = s["tokens_per_s_median"] / base
            out.append(f"Speed at AR's quality ({world}): {s['model']} {s['sampler']} @{s['steps']} "
                       f"{s['tokens_per_s_median']:.0f} tokens/s at batch 1 (KL {fmt(k['kl_rate'], 4)} <= "
                       f"{ceiling:.4f}) against AR's {base:.0f} ({ratio:.2f}x; goal >= 1.5x): "
                       f"{'met' if ratio >= 1.5 else 'missed'}.")  # fmt: skip
    return out


def distil_goals(rows: list[dict]) -> list[str]:
    out = []
    for teacher in ("masked", "gaussian"):
        for s in pick(rows, model=f"{teacher} student", role="student"):
            t = pick(rows, model=teacher, role="teacher", steps=s["steps"])
            if not t:
                continue
            ok = num(s["kl_rate"]) < num(t[0]["kl_rate"])
            out.append(f"Distillation, {teacher} @{s['steps']}: student KL rate {fmt(s['kl_rate'], 4)} "
                       f"against its teacher's {fmt(t[0]['kl_rate'], 4)} (oracle {fmt(s['oracle_kl_rate'], 4)}): "
                       f"{'below' if ok else 'not below'} the teacher.")  # fmt: skip
    return out


ONE_DRAW_SD = 0.042  # the validation curve's seed-to-seed sd (masked oracle, this val set)


def crossover_goals(cross: list[dict], settled: list[dict]) -> list[str]:
    """Masked's best excess on a fixed sample against AR's (AR's is exact): from a curve of
    single-draw estimates, or, where the model was kept, from its bound at many draws paired
    with the oracle's (the settled figure)."""
    out = []
    for tokens in sorted({c["train_tokens"] for c in cross}):
        ar = [c for c in cross if c["train_tokens"] == tokens and c["process"] == "autoregressive"]
        if not ar:
            continue
        a = min(ar, key=lambda c: c["best_excess_bits"])
        said = f"AR's exact best {a['best_excess_bits']:+.4f} at {a['best_at_epochs']:.0f} epochs"
        for m in [c for c in cross if c["train_tokens"] == tokens and c["process"] == "masked"]:
            gap = m["best_excess_bits"] - a["best_excess_bits"]
            verdict = ("below AR" if gap < -2 * ONE_DRAW_SD else "above AR" if gap > 2 * ONE_DRAW_SD
                       else "within two sd of AR: not settled")  # fmt: skip
            out.append(f"Data-constrained, {tokens // 1000}k tokens ({m['recipe']}, {m['steps']} steps): "
                       f"masked's best single-draw estimate {m['best_excess_bits']:+.4f} bits (sd "
                       f"{ONE_DRAW_SD}) at {m['best_at_epochs']:.0f} epochs against {said}: {verdict}.")  # fmt: skip
        for c in [c for c in settled if c["run"].endswith(f"-{tokens // 1000}k")]:
            below = c["excess_over_oracle"] + 2 * c["excess_se"] < a["best_excess_bits"]
            out.append(f"Data-constrained, {tokens // 1000}k tokens, settled ({c['recipe']}): the kept "
                       f"masked model's bound minus the oracle's at {c['draws']} paired draws "
                       f"{c['excess_over_oracle']:+.4f} ± {c['excess_se']:.4f} against {said}: "
                       f"{'below' if below else 'not below'} AR.")  # fmt: skip
    return out


def section(title: str, header: list[str], cells: list[list]) -> list[str]:
    """A markdown table under its heading."""
    lines = ["", f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in cells]


def markdown(report: dict) -> str:
    """The measured section of docs/results/worlds_learned.md."""
    rows = report["rows"]
    lines = [f"{report['samples']} samples of 128 tokens per sampler row, seed 0; bounds on "
             f"{report['likelihood_sequences']} exact sequences; every job's steps, CPU time and "
             "parallel jobs in the JSON's `jobs` (as `cdlm-table` reads them)."]  # fmt: skip
    lines += section(
        "Trained models: bound against the oracle's and the truth (bits/token)",
        ["world", "model", "train steps", "bound", "oracle bound", "excess bits",
         "bound - entropy rate", "oracle - entropy rate"],
        [[m["world"], m["model"], m["train_steps"], f"{m['bits_per_token']:.3f}",
          f"{m['oracle_bits_per_token']:.3f}", f"{m['excess_bits']:.3f}",
          f"{m['bound_minus_entropy_rate']:.3f}", f"{m['oracle_minus_entropy_rate']:.3f}"]
         for m in models(rows)],
    )  # fmt: skip
    times = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
    lines += section(
        "Gaussian context gain, model / exact posterior on the model's embedding table",
        ["world", "model", *(f"t = {t:g}" for t in times)],
        [[m["world"], m["model"], *(f"{m[f'context_gain_t{t:g}']:.3f} / "
          f"{m[f'oracle_context_gain_t{t:g}']:.3f}" for t in times)]
         for m in models(rows) if "context_gain" in m],
    )  # fmt: skip
    lines += section(
        "Error split: each sampler on the learned model and on the oracle",
        ["world", "model", "role", "sampler", "steps", "tokens/call", "KL rate", "oracle KL rate",
         "model's share", "KL floor", "TV rate", "oracle TV", "violations", "oracle violations"],
        [[r["world"], r["model"], r["role"], r["sampler"], r["steps"], fmt(r["tokens_per_call"], 2),
          fmt(r["kl_rate"], 4), fmt(r["oracle_kl_rate"], 4), fmt(r["model_kl_share"], 4),
          fmt(r["kl_floor"], 4), fmt(r["tv_rate"], 3), fmt(r["oracle_tv_rate"], 3),
          fmt(r["violation_rate"], 3), fmt(r["oracle_violation_rate"], 3)]
         for r in rows if "kind" not in r and "kl_rate" in r],
    )  # fmt: skip
    lines += section(
        "Speed on this CPU (one thread; tokens/s min / median / max of 3)",
        ["world", "model", "sampler", "steps", "batch", "tokens/s"],
        [[r["world"], r["model"], r["sampler"], r["steps"], r["batch"],
          f"{r['tokens_per_s_min']:.0f} / {r['tokens_per_s_median']:.0f} / {r['tokens_per_s_max']:.0f}"]
         for r in rows if r.get("kind") == "speed"],
    )  # fmt: skip
    if report["crossover"]:
        lines += section(
            "Data-constrained: a fixed sample of the character world",
            ["recipe", "process", "train tokens", "steps", "epochs", "best excess (bits)",
             "at epochs", "excess at the end"],
            [[c["recipe"], c["process"], c["train_tokens"], c["steps"], f"{c['epochs']:.0f}",
              f"{c['best_excess_bits']:+.4f}", f"{c['best_at_epochs']:.0f}", f"{c['curve'][-1][1]:+.4f}"]
             for c in report["crossover"]],
        )  # fmt: skip
    if report.get("crossover_bounds"):
        lines += section(
            "Data-constrained runs with their model kept: the bound at many draws (± SE)",
            ["recipe", "run", "draws", "bound - exact NLL", "oracle bound - exact NLL",
             "bound - oracle bound"],
            [[c["recipe"], c["run"], c["draws"],
              f"{c['bound_minus_nll']:+.4f} ± {fmt(c['bound_se'], 4)}",
              f"{c['oracle_bound_minus_nll']:+.4f} ± {fmt(c['oracle_bound_se'], 4)}",
              f"{c['excess_over_oracle']:+.4f} ± {c['excess_se']:.4f}"]
             for c in report["crossover_bounds"]],
        )  # fmt: skip
    if report.get("austen"):
        lines += section(
            "The Austen quickstart, 2 runs at a time: each recipe and its lever "
            "(gen-PPL under SmolLM2-135M)",
            ["recipe", "minutes", "train steps", "val bound (bits, 1 draw)", "sampler", "steps", "T",
             "gen-PPL", "entropy"],
            [[r["recipe"], f"{r['minutes']:g}", r["train_steps"], f"{r['bits_per_token']:.3f}", r["sampler"], r["steps"],
              f"{r['temperature']:g}", fmt(r["gen_ppl"], 0), fmt(r["entropy"], 2)]
             for r in report["austen"]],
        )  # fmt: skip
    if report.get("austen_bounds"):
        lines += section(
            "The Austen pairs' bounds at the same draws (bits/token ± SE; the difference paired)",
            ["recipe", "lever", "draws x sequences", "recipe's bound", "lever's bound", "lever - recipe"],
            [[b["before"], b["after"], f"{b['draws']} x {b['sequences']}",
              f"{b['before_bits']:.3f} ± {b['before_se']:.3f}", f"{b['after_bits']:.3f} ± {b['after_se']:.3f}",
              f"{b['difference']:+.3f} ± {b['difference_se']:.3f}"]
             for b in report["austen_bounds"]],
        )  # fmt: skip
    lines += ["", "### Goals", ""] + [f"- {g}" for g in report["goals"]]
    return "\n".join(lines) + "\n"
