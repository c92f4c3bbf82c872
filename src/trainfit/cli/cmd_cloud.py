"""`trainfit cloud MODEL ...`: rank cloud flavors by whether the job fits, its time and its cost."""

from __future__ import annotations

import argparse

from trainfit.cli.framework_arg import add_framework_argument, change_json, chosen, print_profile, profile_json
from trainfit.core.frameworks import resolve_framework
from trainfit.core.plan.cloud_rank import DEFAULT_GLOBAL_BATCH, DEFAULT_SETUP_MINUTES, CloudRanking, CloudRequest
from trainfit.core.setup import DEFAULT_METHOD, METHOD_ALIASES, TRAIN_METHODS, parse_method
from trainfit.errors import EXIT_DOES_NOT_FIT, EXIT_OK, BadInputError
from trainfit.validate import arg

HELP = "rank cloud flavors (HF Jobs, AWS, GCP, Azure, Lambda, RunPod, ...) by fit, time and cost"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model id, alias or config.json directory (see: trainfit models)")
    parser.add_argument("--method", default=DEFAULT_METHOD, choices=(*TRAIN_METHODS, *METHOD_ALIASES, "auto"),
                        help=f"training method (default {DEFAULT_METHOD}, as estimate and plan, falling back to "
                        "LoRA, then QLoRA, on a flavor where it does not fit unless --no-fallback; auto = full; "
                        "sft = full)")
    parser.add_argument("--dataset-tokens", type=arg("dataset_tokens"), help="tokens in the dataset (one epoch)")
    parser.add_argument("--examples", type=arg("examples"), help="examples (DPO: preference pairs) in the dataset")
    from trainfit.cli.knob_flags import add_knob_flags

    add_knob_flags(parser, "cloud", only=("seq_len",))  # declared in trainfit.core.knobs
    parser.add_argument("--epochs", type=arg("epochs"), default=1.0, help="epochs (default 1)")
    parser.add_argument("--budget", type=arg("budget_usd"), help="most dollars to spend")
    parser.add_argument("--max-hours", type=arg("max_hours"), help="most hours the run may take")
    parser.add_argument("--prices", help="YAML or CSV file overriding / adding flavors and prices")
    parser.add_argument("--flavor", action="append", help="only this flavor (repeatable)")
    parser.add_argument("--no-fallback", action="store_true", help="never fall back to LoRA / QLoRA")
    parser.add_argument("--spot", action="store_true", help="spot / interruptible prices where known, ranked by the "
                        "expected cost with interruptions (re-done work, restarts, checkpoints)")
    parser.add_argument("--global-batch", type=arg("global_batch"), default=DEFAULT_GLOBAL_BATCH,
                        help=f"sequences per optimizer step (default {DEFAULT_GLOBAL_BATCH})")  # fmt: skip
    parser.add_argument("--setup-minutes", type=arg("setup_minutes"), default=DEFAULT_SETUP_MINUTES,
                        help=f"billed time before training starts (default {DEFAULT_SETUP_MINUTES:g})")  # fmt: skip
    parser.add_argument("--top", type=arg("top"), default=0, help="show only the first N rows (default all)")
    add_framework_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def cloud(
    model: str,
    *,
    method: str = DEFAULT_METHOD,
    dataset_tokens: int | None = None,
    examples: int | None = None,
    seq_len: int = 1024,
    epochs: float = 1.0,
    budget: float | None = None,
    max_hours: float | None = None,
    prices: str | None = None,
    flavors: list[str] | None = None,
    allow_fallback: bool = True,
    spot: bool = False,
    global_batch: int = DEFAULT_GLOBAL_BATCH,
    setup_minutes: float = DEFAULT_SETUP_MINUTES,
    framework: str | None = None,
) -> CloudRanking:
    """Python twin of `trainfit cloud`: the ranking it prints."""
    return _cloud(model, method=method, dataset_tokens=dataset_tokens, examples=examples, seq_len=seq_len,
                  epochs=epochs, budget=budget, max_hours=max_hours, prices=prices, flavors=flavors,
                  allow_fallback=allow_fallback, spot=spot, global_batch=global_batch, setup_minutes=setup_minutes,
                  framework=framework)[0]


def _cloud(model: str, *, method: str, dataset_tokens: int | None, examples: int | None, seq_len: int, epochs: float,
           budget: float | None, max_hours: float | None, prices: str | None, flavors: list[str] | None,
           allow_fallback: bool, spot: bool, global_batch: int, setup_minutes: float, framework: str | None):
    """(ranking, request, catalog)."""
    from trainfit.core.cloud.catalog import load_cloud_catalog
    from trainfit.core.plan.cloud_rank import rank_flavors
    from trainfit.core.speed import Workload
    from trainfit.hub import resolve_model

    method = parse_method("full" if method == "auto" else method, allowed=TRAIN_METHODS)  # auto: plan's name
    if dataset_tokens is not None and examples is not None:
        raise BadInputError("give either --dataset-tokens or --examples, not both")
    if framework is not None:
        resolve_framework(framework)  # a bad --framework fails before any work
    catalog = load_cloud_catalog(prices)  # bad price files fail before any model work
    spec = resolve_model(model)
    req = CloudRequest(
        model=spec, method=method, seq_len=seq_len,  # type: ignore[arg-type]
        workload=Workload(examples=examples, dataset_tokens=dataset_tokens, epochs=epochs),
        allow_fallback=allow_fallback, budget_usd=budget, max_hours=max_hours, global_batch=global_batch,
        setup_minutes=setup_minutes, spot=spot,
        framework=None if framework is None else resolve_framework(framework),
    )  # fmt: skip
    return rank_flavors(req, catalog, flavor_ids=flavors), req, catalog


def run(args: argparse.Namespace) -> int:
    ranking, req, catalog = _cloud(
        args.model, method=args.method, dataset_tokens=args.dataset_tokens, examples=args.examples,
        seq_len=args.seq_len, epochs=args.epochs, budget=args.budget, max_hours=args.max_hours,
        prices=args.prices, flavors=args.flavor, allow_fallback=not args.no_fallback, spot=args.spot,
        global_batch=args.global_batch, setup_minutes=args.setup_minutes, framework=args.framework,
    )  # fmt: skip
    framework = chosen(args, this_machine=False)
    flavor = ranking.cheapest or ranking.fastest
    effects = [] if framework.is_own or flavor is None else flavor_effects(req, catalog, flavor, framework)
    if args.json:
        from trainfit.cli.output import print_json
        from trainfit.core.serde import to_jsonable

        doc = to_jsonable(ranking)
        doc["framework"] = {**profile_json(framework), "flavor": flavor if effects else None,
                            "changes": [change_json(e) for e in effects]}
        print_json(doc)
    else:
        _render(ranking, args.top)
        print_profile(framework, flavor, effects)
    if ranking.cheapest is None:
        from trainfit.cli.output import say

        say(f"trainfit: {ranking.recommendation}" + (f"; {ranking.reasoning[0]}" if ranking.reasoning else ""))
        return EXIT_DOES_NOT_FIT
    return EXIT_OK


def flavor_effects(req, catalog, flavor_id: str, framework) -> list:
    """What each behaviour of the framework adds to the setting chosen on one flavor (memory, step time)."""
    from trainfit.cli.framework_arg import applied_for, effects, needed_bytes_fn
    from trainfit.core.plan.cloud_rank import chosen_setting
    from trainfit.core.speed import predict_step

    found = chosen_setting(req, catalog, flavor_id)
    if found is None:
        return []
    setup, hw, rates = found
    applied = applied_for(framework, setup)
    return effects(applied, needed_bytes_fn(req.model, hw), lambda s: predict_step(req.model, s, rates).step_seconds)


def _render(r: CloudRanking, top: int) -> None:
    from rich.table import Table

    from trainfit.cli.output import console

    out = console()
    from rich import box

    table = Table(title=f"{r.model_id} - {r.method}, {r.tokens_per_epoch:,} tokens x {r.epochs:g} epoch(s)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    rows = r.results[:top] if top > 0 else r.results
    widths, dropped = table_columns([x.flavor for x in rows], spot=r.spot, width=out.width)
    right = ("$/h", "hours", "cost", "memory GiB")
    for col, col_width in widths.items():
        # The flavor id is never cut (it is pasted into `plan --flavor`); one longer than the terminal folds.
        table.add_column(col, justify="right" if col in right else "left", no_wrap=col != "flavor",
                         overflow="fold" if col == "flavor" else "ellipsis", width=col_width)
    for x in rows:
        gpus = f"{x.gpu_count}x {x.gpu}" if x.gpu else "cpu"
        mem = f"{x.memory_gib_per_device:.1f}/{x.capacity_gib_per_device:.0f}" if x.fits else (
            f"{x.memory_ratio:.2f}x" if x.memory_ratio else "-")  # fmt: skip
        flag = "yes" if x.fits else "no"
        if x.fits and (x.within_budget is False or x.within_time is False):
            flag = "limit"  # fits, but over the budget or the time limit
        cells = [
            x.flavor, gpus, f"{x.usd_per_hour:.2f}" if x.usd_per_hour is not None else "-", flag, x.why, mem,
            f"{x.hours:.1f}" if x.hours is not None else "-", f"${x.cost_usd:.2f}" if x.cost_usd is not None else "-",
        ]  # fmt: skip
        cells.append(_spot_cell(x) if r.spot else x.cost_class or "-")
        table.add_row(*[cell for col, cell in zip(ALL_COLUMNS(r.spot), cells) if col in widths])
    out.print(table)
    if dropped:
        out.print(f"({', '.join(dropped)} left out at {out.width} columns; --json or a wider terminal shows them)")
    out.print(f"[bold]Recommendation:[/bold] {r.recommendation}")
    for line in r.reasoning:
        out.print(f"  - {line}")
    if r.skipped:
        out.print(f"Not evaluated: {', '.join(f'{k} ({v})' for k, v in r.skipped.items())}")
    out.print("Hours include the setup time; GiB are binary (2^30). Prices: see each flavor's source (--json).")
    if r.spot:
        out.print("Spot: hours and cost are expected values with interruptions. M: mean hours between interruptions "
                  "(* assumed from another provider's measurement); ckpt: minutes of training between checkpoints; "
                  "+: checkpoints, re-done work and restarts; 'on-demand': no spot price in the catalog.")


# Width of each column (the setting column takes what is left, between its two figures): one line
# per flavor within 120 columns; --json has every field in full.
_WIDTHS = {"flavor": 18, "GPUs": 12, "$/h": 6, "fits": 5, "setting / why not": (12, 26),
           "memory GiB": 10, "hours": 5, "cost": 8, "class": 10}
# The cost class gives way to the interruption figure, checkpoint interval and expected overhead.
_SPOT_WIDTHS = {"flavor": 16, "GPUs": 10, "$/h": 6, "fits": 5, "setting / why not": (12, 16),
                "memory GiB": 10, "hours": 5, "cost": 8, "spot: M ckpt +": 17}
# Left out first when the terminal is narrow; flavor, hours, cost and class / spot always stay.
_DROP_ORDER = ("setting / why not", "GPUs", "$/h", "fits", "memory GiB")


def ALL_COLUMNS(spot: bool) -> tuple[str, ...]:  # noqa: N802 - reads as the constant it stands for
    return tuple(_SPOT_WIDTHS if spot else _WIDTHS)


def _table_width(widths: dict[str, int]) -> int:
    # rich's SIMPLE_HEAD box with pad_edge=False: an edge each side, a separator and two padding
    # spaces between columns: 3n - 1 characters around n columns.
    return sum(widths.values()) + 3 * len(widths) - 1


def table_columns(flavor_ids: list[str], *, spot: bool, width: int) -> tuple[dict[str, int], list[str]]:
    """The table's columns for a terminal `width` columns wide: (name -> width, the columns left
    out). The flavor column is as wide as the longest id shown, so no id is cut."""
    spec = dict(_SPOT_WIDTHS if spot else _WIDTHS)
    spec["flavor"] = max([len("flavor"), *map(len, flavor_ids)])
    dropped: list[str] = []
    for col in (None, *_DROP_ORDER):
        if col is not None:
            del spec[col]
            dropped.append(col)
        widths = {k: (v[0] if isinstance(v, tuple) else v) for k, v in spec.items()}
        if _table_width(widths) <= width:
            break
    setting = spec.get("setting / why not")
    if isinstance(setting, tuple):  # the room left, up to the column's widest
        widths["setting / why not"] = min(setting[1], setting[0] + width - _table_width(widths))
    return widths, dropped


def _spot_cell(x) -> str:
    """M, checkpoint interval and expected overhead of one row of the --spot table."""
    e = x.spot
    if e is None:
        return "on-demand" if x.spot_note else "-"
    star = "*" if e.assumed else ""
    from trainfit.core.cloud.spot import hours_text

    return (f"{hours_text(e.interruption_hours).replace(' ', '')}{star} {e.checkpoint_interval_seconds / 60:.1f}m "
            f"+{e.expected_overhead_share:.0%}")
