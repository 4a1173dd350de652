"""`vcppo report RUN_DIR... [--out DIR]`: a markdown page + PNG plots for one run or several.

Reads each run's ``metrics.jsonl`` (and ``final_metrics.json``) and draws, one line per run:
  * mean response length over PPO steps
  * training accuracy and mean reward over PPO steps
  * validation greedy pass@1
  * value-pretraining value loss and explained variance
  * the critic's explained variance and the advantage-position correlation over PPO steps
  * the mean advantage by token position at the start and end of value pretraining (or of PPO
    for runs without it)
  * for multi-turn runs, the critic's value and the advantage by turn, first and last PPO step
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from vcppo.tracking import last_samples, read_metrics


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = sorted((r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)))
    return [p[0] for p in pts], [p[1] for p in pts]


def _profile_points(rec: dict) -> tuple[list[float], list[float]] | None:
    prof, edges = rec.get("adv/position_profile"), rec.get("adv/position_edges")
    if not prof or not edges:
        return None
    centres = [(edges[i] + edges[i + 1]) / 2 for i in range(len(prof))]
    keep = [(c, v) for c, v in zip(centres, prof) if v is not None]
    return [c for c, _ in keep], [v for _, v in keep]


def run_summary(run_dir: Path) -> dict:
    """The figures a results table needs from one run."""
    ppo = sorted(read_metrics(run_dir, "ppo"), key=lambda r: r["step"])
    pre = sorted(read_metrics(run_dir, "value_pretrain"), key=lambda r: r["step"])
    val = sorted(read_metrics(run_dir, "val"), key=lambda r: r["step"])
    out: dict = {"run": run_dir.name, "ppo_steps": len(ppo), "pretrain_steps": len(pre)}
    if ppo:
        k = max(1, len(ppo) // 5)  # average the first / last fifth: single steps are noisy
        mean = lambda rs, key: sum(r.get(key) or 0.0 for r in rs) / len(rs)  # noqa: E731
        out["length_start"] = mean(ppo[:k], "response/length_mean")
        out["length_end"] = mean(ppo[-k:], "response/length_mean")
        out["train_acc_start"] = mean(ppo[:k], "reward/accuracy")
        out["train_acc_end"] = mean(ppo[-k:], "reward/accuracy")
        evs = [r.get("critic/explained_variance") for r in ppo[-k:] if r.get("critic/explained_variance") is not None]
        out["explained_variance_end"] = sum(evs) / len(evs) if evs else math.nan
        corr = [r.get("adv/position_corr") for r in ppo[:k] if r.get("adv/position_corr") is not None]
        out["adv_position_corr_start"] = sum(corr) / len(corr) if corr else math.nan
        by_turn = [r for r in ppo if r.get("env/value_by_turn")]
        if by_turn:  # multi-turn: what the plot of value and advantage by turn drew, last step
            out["value_by_turn_end"] = by_turn[-1]["env/value_by_turn"]
            out["adv_by_turn_end"] = by_turn[-1]["env/adv_by_turn"]
    if val:
        out.update({k.replace("val/", "start_"): v for k, v in val[0].items() if k.startswith("val/pass")})
        out.update({k.replace("val/", "final_"): v for k, v in val[-1].items() if k.startswith("val/")})
    return out


def _line_plot(plt, out_dir: Path, data: dict, fname: str, phase: str, keys: list[tuple[str, str]],
               title: str) -> tuple[str, str] | None:
    """One panel per key, one line per run; (file name, title) when anything was drawn."""
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 3.8), squeeze=False)
    drew = False
    for ax, (key, label) in zip(axes[0], keys):
        for i, (name, d) in enumerate(data.items()):
            xs, ys = _series(d[phase], key)
            if xs:  # one colour per run across every panel, whichever runs a panel lacks
                ax.plot(xs, ys, label=name, color=f"C{i % 10}", marker="." if len(xs) < 30 else None)
                drew = True
        if ax.lines:
            ax.legend(fontsize=7)
        ax.set_xlabel(f"{phase} step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if drew:
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
    plt.close(fig)
    return (fname, title) if drew else None


def _began(record: dict) -> float:
    """When the work a record reports began: its time less its step's or its validation's seconds.
    A split run logs a validation when it arrives, possibly after a later step's record, so the
    first record's own time would start the clock at different points in the two placements."""
    return record["time"] - (record.get("time/step_s") or record.get("time/val_s") or 0.0)


def _wallclock_plot(plt, out_dir: Path, data: dict) -> tuple[str, str] | None:
    """Validation pass@1 (greedy and sampled) against minutes since the run's first step (or
    validation) began: what a faster schedule (split placement) buys at equal steps shows as the
    same curve, further left."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    drew = False
    for ax, (key, label) in zip(axes, (("val/pass@1_greedy", "val greedy pass@1"), ("val/pass@1", "val sampled pass@1"))):
        for i, (name, d) in enumerate(data.items()):
            records = d["value_pretrain"] + d["ppo"] + d["val"]
            points = [(r["time"], r[key]) for r in d["val"] if r.get(key) is not None and "time" in r]
            if points and records:
                start = min(_began(r) for r in records if "time" in r)
                ax.plot([(t - start) / 60 for t, _ in points], [v for _, v in points], label=name,
                        color=f"C{i % 10}", marker=".")
                drew = True
        if ax.lines:
            ax.legend(fontsize=7)
        ax.set_xlabel("minutes since the run's first step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    title = "Validation against wall-clock"
    if drew:
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out_dir / "validation_wallclock.png", dpi=110)
    plt.close(fig)
    return ("validation_wallclock.png", title) if drew else None


def _advantage_profile_plot(plt, out_dir: Path, data: dict) -> tuple[str, str] | None:
    """Advantage vs position: first and last record of value pretraining (or of PPO without it)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    drew = False
    for name, d in data.items():
        recs = d["value_pretrain"] or d["ppo"]
        phase = "value pretraining" if d["value_pretrain"] else "PPO"
        for rec, style, when in ((recs[0], "--", "start"), (recs[-1], "-", "end")) if recs else ():
            pts = _profile_points(rec)
            if pts:
                ax.plot(*pts, style, marker=".", label=f"{name}: {phase} {when} (step {rec['step']})")
                drew = True
    if drew:
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xlabel("token position in response")
        ax.set_ylabel("mean raw advantage (lambda_actor)")
        ax.set_title("Mean advantage by token position, first and last step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "advantage_profile.png", dpi=110)
    plt.close(fig)
    return ("advantage_profile.png", "Mean advantage by token position") if drew else None


def _by_turn_plot(plt, out_dir: Path, data: dict) -> tuple[str, str] | None:
    """Multi-turn runs: the mean value and the mean raw advantage of each turn's model tokens, at the
    first and the last PPO step."""
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    drew = False
    for name, d in data.items():
        recs = [r for r in d["ppo"] if r.get("env/adv_by_turn")]
        for rec, style, when in ((recs[0], "--", "first"), (recs[-1], "-", "last")) if recs else ():
            for ax, key in zip(axes, ("env/value_by_turn", "env/adv_by_turn")):
                pts = [(k + 1, v) for k, v in enumerate(rec.get(key) or []) if v is not None]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{name}: step {rec['step']} ({when})")
                    drew = True
    if drew:
        for ax, label in zip(axes, ("mean value V_old", "mean raw advantage")):
            ax.axhline(0, color="gray", lw=0.8)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # turns are whole numbers
            ax.set_xlabel("turn")
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
        fig.suptitle("Episodes: value and advantage by turn")
        fig.tight_layout()
        fig.savefig(out_dir / "by_turn.png", dpi=110)
    plt.close(fig)
    return ("by_turn.png", "Episodes: value and advantage by turn") if drew else None


_LINE_PLOTS = [
    ("response_length.png", "ppo", [("response/length_mean", "mean response length (tokens)")],
     "PPO: mean response length"),
    ("accuracy.png", "ppo", [("reward/accuracy", "train accuracy"), ("reward/mean", "mean reward")],
     "PPO: training accuracy and mean reward"),
    ("validation.png", "val", [("val/pass@1_greedy", "val greedy pass@1")], "Validation: greedy pass@1"),
    ("value_pretraining.png", "value_pretrain",
     [("critic/value_loss", "value loss"), ("critic/explained_variance", "explained variance")],
     "Value pretraining: value loss and explained variance"),
    ("critic_ppo.png", "ppo",
     [("critic/explained_variance", "explained variance"), ("adv/position_corr", "corr(position, advantage)")],
     "PPO: critic explained variance and advantage-position correlation"),
]


def _markdown(title: str, summaries: list[dict], plots: list[tuple[str, str]]) -> str:
    keys = [k for k in ("run", "pretrain_steps", "ppo_steps", "start_pass@1_greedy", "final_pass@1_greedy",
                        "final_pass@4", "length_start", "length_end", "explained_variance_end",
                        "adv_position_corr_start") if any(k in s for s in summaries)]
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"# {title}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(s.get(k, "")) for k in keys) + " |" for s in summaries]
    lines += ["", "`start_*` is validation before the first PPO step, `final_*` after the last; lengths are "
              "means over the first / last fifth of PPO steps (tokens).", ""]
    for fname, t in plots:
        lines += [f"## {t}", "", f"![{t}]({fname})", ""]
    return "\n".join(lines)


def visible(text: str) -> str:
    """``text`` with every character that is not printable (control characters such as NUL, BEL and
    ESC, format characters, lone surrogates) as its Python escape, ``\\x1b``: a sample cannot drive
    the terminal or viewer that shows the page, and the page stays valid UTF-8."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _cell(text: str, limit: int = 300) -> str:
    """Text for one markdown table cell: one line, control characters escaped, pipes escaped, long
    text cut (its end kept)."""
    text = visible(" ".join(str(text).split())).replace("|", "\\|")
    return text if len(text) <= limit else "..." + text[-limit:]


def samples_markdown(run_dir: Path) -> str:
    """The last PPO step's samples (``logging.log_samples``) as a table; empty without any."""
    step, samples = last_samples(run_dir)
    if not samples:
        return ""
    lines = [f"## Samples of {run_dir.name}, PPO step {step}", "",
             "| prompt | response | reward | score | length | advantage mean / min / max |",
             "|---|---|---|---|---|---|"]
    for s in samples:
        num = lambda k: f"{s[k]:.3g}" if isinstance(s.get(k), (int, float)) else "-"  # noqa: E731
        lines.append(f"| {_cell(s.get('prompt', ''), 120)} | {_cell(s.get('response', ''))} | {num('reward')} | "
                     f"{num('score')} | {s.get('length', '')} | {num('adv_mean')} / {num('adv_min')} / {num('adv_max')} |")
    return "\n" + "\n".join(lines) + "\n"


def make_report(run_dirs: list[Path], out_dir: Path, title: str = "vcppo report") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    data = {d.name: {ph: sorted(read_metrics(d, ph), key=lambda r: r["step"])
                     for ph in ("ppo", "value_pretrain", "val")} for d in run_dirs}
    plots = [_line_plot(plt, out_dir, data, *spec) for spec in _LINE_PLOTS]
    plots.append(_wallclock_plot(plt, out_dir, data))
    plots.append(_advantage_profile_plot(plt, out_dir, data))
    plots.append(_by_turn_plot(plt, out_dir, data))
    plots = [p for p in plots if p is not None]
    summaries = [run_summary(d) for d in run_dirs]
    page = out_dir / "report.md"
    page.write_text(_markdown(title, summaries, plots) + "".join(samples_markdown(d) for d in run_dirs))
    (out_dir / "summary.json").write_text(json.dumps(summaries, indent=1))
    return page
