"""`trainfit gpus`: list the GPU catalog (memory, dense peak TFLOPS, bandwidth, power, links)."""

from __future__ import annotations

import argparse
import typing

from trainfit.core.machines.gpu_catalog import all_gpus
from trainfit.core.machines.gpu_spec import GpuSpec, Vendor

HELP = "list the GPU catalog: memory, dense peak TFLOPS, bandwidth, power, interconnect"

VENDORS = typing.get_args(Vendor)
SORT_KEYS = {
    # descending: the biggest first, which is what someone choosing hardware scans for
    "vram": lambda g: g.vram_bytes,
    "bf16": lambda g: g.peak_tflops.get("bf16", 0.0),
    "bandwidth": lambda g: g.memory_bandwidth_gbps,
}
GIB = 1 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vendor", choices=VENDORS, help="only this vendor's GPUs")
    parser.add_argument("--sort", choices=list(SORT_KEYS),
                        help="sort by memory, bf16 dense TFLOPS or memory bandwidth (largest first)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def list_gpus(vendor: str | None = None, sort: str | None = None) -> list[GpuSpec]:
    """The catalog entries the command prints: filtered by vendor, sorted (catalog order if None)."""
    from trainfit.errors import BadInputError

    if vendor is not None and vendor not in VENDORS:
        raise BadInputError(f"--vendor: {vendor!r} is not one of {', '.join(VENDORS)}")
    if sort is not None and sort not in SORT_KEYS:
        raise BadInputError(f"--sort: {sort!r} is not one of {', '.join(SORT_KEYS)}")
    gpus = [g for g in all_gpus() if vendor is None or g.vendor == vendor]
    if sort:
        gpus.sort(key=SORT_KEYS[sort], reverse=True)  # stable: ties keep catalog order
    return gpus


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.{digits}f}"


def run(args: argparse.Namespace) -> int:
    gpus = list_gpus(args.vendor, args.sort)
    if args.json:
        from trainfit.cli.output import print_json
        from trainfit.core.serde import to_jsonable

        print_json({
            "count": len(gpus),
            "units": {"vram_bytes": "bytes", "memory_bandwidth_gbps": "GB/s (10^9 B/s)",
                      "driver_total_bytes": "bytes: the total nvidia-smi reports (ECC on takes 1/16 on GDDR "
                                            "data-centre parts); usable memory starts here; null: not "
                                            "recorded, vram_bytes is used",
                      "peak_tflops": "dense, no sparsity, 10^12 FLOP/s", "tdp_watts": "W"},
            "gpus": [{**to_jsonable(g), "precisions": list(g.precisions)} for g in gpus],
        })
        return 0
    from rich.table import Table

    from trainfit.cli.output import console

    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 200)  # piped output: do not squeeze figures into 80 columns
    table = Table(caption="VRAM in GiB (2^30 bytes); driver MiB: the total nvidia-smi reports (ECC on, the "
                          "data-centre default, keeps 1/16), '-' where not recorded; TFLOPS dense (no "
                          "sparsity), fp16/bf16 with fp32 accumulate; bandwidth in GB/s (10^9 B/s); sources: "
                          "data/gpus.yaml",
                  caption_justify="left")
    rows = [_row(g) for g in gpus]
    # Piped output has room for every column: widths from the data spare rich measuring each of
    # the ~1,700 cells (a third of the command's time). A terminal lets rich fit the columns.
    fixed = not out.is_terminal
    widths = [max(len(col), 5 if col not in _LEFT else 0, *(len(r[i]) for r in rows)) for i, col in enumerate(_COLUMNS)]
    if fixed:
        out.width = max(out.width, sum(widths) + 3 * len(widths) + 1)  # cells, padding and borders
    for i, col in enumerate(_COLUMNS):
        width = widths[i] if fixed else None
        if col in _LEFT:
            # "name" is the one column allowed to wrap in a narrow terminal
            table.add_column(col, no_wrap=col != "name", width=width)
        else:
            table.add_column(col, justify="right", no_wrap=True, min_width=max(5, len(col)), width=width)
    for r in rows:
        table.add_row(*r)
    out.print(table)
    return 0


_COLUMNS = ("id", "name", "class", "arch", "VRAM GiB", "driver MiB", "BW GB/s", "fp32", "tf32", "bf16", "fp16",
            "fp8", "int8", "TDP W", "link")
_LEFT = ("id", "name", "class", "arch", "link")


def _row(g: GpuSpec) -> tuple[str, ...]:
    tf = g.peak_tflops
    link = g.interconnect or "-"
    if g.interconnect_gbps and not link.startswith("pcie"):
        link += f" {g.interconnect_gbps:.0f} GB/s"
    vram = f"{g.vram_bytes / GIB:.0f}" + (" (unified)" if g.unified_memory else "")
    driver = f"{g.driver_total_bytes >> 20}" if g.driver_total_bytes else "-"
    return (g.id, g.name, g.gpu_class, g.architecture, vram, driver, _fmt(g.memory_bandwidth_gbps),
            *(_fmt(tf.get(p)) for p in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")), _fmt(g.tdp_watts), link)
