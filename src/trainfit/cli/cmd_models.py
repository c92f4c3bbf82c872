"""`trainfit models`: list the model catalog; `trainfit models show REF`: one model's shapes,
exact parameter breakdown and linear-layer (LoRA target) names."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "list the model catalog, or show one model (catalog id, local dir, config.json, shape)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="*", metavar="show REF",
                        help="without arguments: list the catalog; 'show REF': one model in detail, where REF "
                             "is a catalog id or alias, a model directory, a config.json, or a shape "
                             "such as shape:125m")
    parser.add_argument("--family", help="only this family (e.g. qwen2.5, llama3.1, pythia)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def list_models(family: str | None = None):
    """Catalog entries, optionally of one family (case-insensitive)."""
    from trainfit.core.models.catalog import all_models, families
    from trainfit.errors import BadInputError

    if family is not None and family.lower() not in families():
        raise BadInputError(f"--family: {family!r} is not one of {', '.join(families())}")
    return [m for m in all_models() if family is None or m.family == family.lower()]


def show_model(ref: str) -> dict[str, Any]:
    """Everything `models show` prints: the spec, its parameter breakdown and linear layers."""
    from trainfit.core.models.params import count_params, linear_layers, module_names
    from trainfit.core.serde import to_jsonable
    from trainfit.hub import resolve_model

    spec = resolve_model(ref)
    breakdown = count_params(spec)
    return {
        "model": to_jsonable(spec),
        "params": {**to_jsonable(breakdown), "exact_from_safetensors": spec.exact_params},
        "lora_target_modules": module_names(spec),
        "linear_layers": [{**to_jsonable(x), "params": x.params} for x in linear_layers(spec)],
    }


def _human(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _row(m) -> dict[str, Any]:
    from trainfit.core.models.params import count_params

    b = count_params(m)
    return {"id": m.id, "aliases": m.aliases, "family": m.family, "architecture": m.architecture,
            "params": b.total, "active_params_per_token": b.active_per_token, "layers": m.num_layers,
            "hidden_size": m.hidden_size, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
            "vocab_size": m.vocab_size, "context": m.max_position_embeddings, "stored_dtype": m.stored_dtype,
            "source": m.source}


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.output import console, print_json
    from trainfit.errors import BadInputError

    action = list(args.action)
    if action and (action[0] != "show" or len(action) != 2):
        raise BadInputError(f"models: unexpected arguments {' '.join(action)!r}",
                            hint="use 'trainfit models [--family F]' or 'trainfit models show REF'")
    if action:
        info = show_model(action[1])
        if args.json:
            print_json(info)
        else:
            _print_show(info, console())
        return 0
    rows = [_row(m) for m in list_models(args.family)]
    if args.json:
        print_json({"count": len(rows), "units": {"params": "parameters (exact, as transformers builds)",
                                                  "context": "max_position_embeddings (tokens)"},
                    "models": rows})
        return 0
    _print_list(rows, console())
    return 0


def _print_list(rows: list[dict[str, Any]], out) -> None:
    from rich.table import Table

    if not out.is_terminal:
        out.width = max(out.width, 200)  # piped: keep one model per line
    table = Table(caption="params: exact counts (MoE: total / active per token); sources: data/models.yaml",
                  caption_justify="left")
    for col in ("id", "aliases", "params", "layers", "hidden", "heads/kv", "vocab", "context", "dtype"):
        table.add_column(col, justify="right" if col in ("params", "layers", "hidden", "vocab", "context") else
                         "left", no_wrap=col != "aliases")
    for r in rows:
        params = _human(r["params"])
        if r["active_params_per_token"] != r["params"]:
            params += f" / {_human(r['active_params_per_token'])}"
        table.add_row(r["id"], ", ".join(r["aliases"]), params, str(r["layers"]), str(r["hidden_size"]),
                      f"{r['heads']}/{r['kv_heads']}", str(r["vocab_size"]), str(r["context"]), r["stored_dtype"])
    out.print(table)


def _print_show(info: dict[str, Any], out) -> None:
    from rich.table import Table

    m, p = info["model"], info["params"]
    out.print(f"[bold]{m['id']}[/bold]  ({m['architecture']}; source: {m['source']})")
    shape = (f"layers {m['num_layers']}, hidden {m['hidden_size']}, heads {m['num_heads']} "
             f"(kv {m['num_kv_heads']}, head_dim {m['head_dim']}), ffn {m['intermediate_size']}"
             f"{' gated' if m['gated_mlp'] else ''} {m['activation']}, vocab {m['vocab_size']}, "
             f"context {m['max_position_embeddings']}, {m['norm']}, "
             f"{'tied' if m['tie_embeddings'] else 'untied'} embeddings, stored {m['stored_dtype']}")
    if m["num_experts"]:
        shape += f", {m['num_experts']} experts (top-{m['experts_per_token']}, shared {m['shared_experts']})"
    if m["sliding_window"]:
        shape += f", sliding window {m['sliding_window']}"
    out.print(shape)
    table = Table(title="parameters", title_justify="left")
    table.add_column("part")
    table.add_column("count", justify="right")
    n = p["num_layers"]
    for label, value in (("embedding", p["embedding"]), ("position embedding", p["position_embedding"]),
                         (f"attention ({n} x {p['attention_per_layer']:,})", n * p["attention_per_layer"]),
                         (f"mlp ({n} x {p['mlp_per_layer']:,})", n * p["mlp_per_layer"]),
                         (f"experts ({n} x {p['experts_per_layer']:,})", n * p["experts_per_layer"]),
                         (f"router ({n} x {p['router_per_layer']:,})", n * p["router_per_layer"]),
                         (f"norms ({n} x {p['norms_per_layer']:,})", n * p["norms_per_layer"]),
                         ("final norm", p["final_norm"]), ("lm_head (0: tied)", p["lm_head"]),
                         ("vision tower", p["vision"]),
                         ("cross-attention (decoder blocks)", p.get("cross_attention", 0)),
                         ("other (embedding norms, heads, position tables)", p.get("other", 0))):
        if value or label.startswith("lm_head"):
            table.add_row(label, f"{value:,}")
    table.add_row("[bold]total[/bold]", f"[bold]{p['total']:,}[/bold]")
    if p["active_per_token"] != p["total"]:
        table.add_row("active per text token", f"{p['active_per_token']:,}")
    if p["exact_from_safetensors"] is not None:
        table.add_row("in safetensors headers", f"{p['exact_from_safetensors']:,}")
    out.print(table)
    layers = Table(title="linear layers (LoRA target_modules: names; 'all-linear' = all but lm_head)",
                   title_justify="left")
    for col in ("name", "path", "in", "out", "count", "bias", "where"):
        layers.add_column(col, justify="right" if col in ("in", "out", "count") else "left")
    for x in info["linear_layers"]:
        where = "vision" if x["vision"] else {"expert": "expert param", "router": "router param"}.get(x["kind"], x["kind"])
        layers.add_row(x["name"], x["path"], str(x["in_features"]), str(x["out_features"]), str(x["count"]),
                       "yes" if x["bias"] else "no", where)
    out.print(layers)
