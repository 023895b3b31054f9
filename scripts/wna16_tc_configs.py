"""The "tc" variant of scripts/wna16_gemv_variants.py: lamina.kernels.wna16_tc (the tensor-core GEMV) and the
configs it is timed at. Imported by that script (beside this one); imports triton through the kernel, lazily."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import torch

TC_CONFIG_NAME = re.compile(r"t(\d+)-c(\d+)(?:-s(\d+))?(-pf)?$")


def tc_gemv(x: torch.Tensor, op: dict[str, Any], cfg: Any) -> torch.Tensor:
    from lamina.kernels.wna16_tc import wna16_tc_gemv

    return wna16_tc_gemv(x, op["words"], op["scale"], op["zero"], None, op["bits"], op["group_size"],
                         op.get("xor", 0), config=cfg)


def tc_takes(op: dict[str, Any], k: int, rows: int) -> bool:
    from lamina.kernels.wna16_tc import takes

    return takes(torch.bfloat16, rows, k, op["bits"], op["group_size"])


def tc_configs(n: int, k: int, op: dict[str, Any], quick: bool, tiny: bool, sms: int, named: list[str]) -> list[Any]:
    """The default, then tiles x chunks with auto_split's K split (and half, twice it); `named` instead when given
    (parse_tc_config); three small configs for the interpreter (`tiny`)."""
    from lamina.kernels.wna16_tc import WNA16TCConfig, auto_split, default_config

    if tiny:
        return [WNA16TCConfig(1, 1), WNA16TCConfig(2, 2, split=2), WNA16TCConfig(2, 1, split=3, prefetch=False)]
    kw = k * op["bits"] // 32
    if named:
        return [parse_tc_config(name, n, kw, sms) for name in named]
    cfgs = [default_config(n, kw, sms)]
    for tiles, chunks in [(1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (2, 4)][:2 if quick else None]:
        base = auto_split(WNA16TCConfig(tiles, chunks), n, kw, sms)
        for split in sorted({base.split, max(1, base.split // 2), base.split * 2}):
            cfg = replace(base, split=split)
            if cfg not in cfgs:
                cfgs.append(cfg)
    return cfgs


def parse_tc_config(name: str, n: int, kw: int, sms: int) -> Any:
    """A config by name, t<tiles>-c<chunks>[-s<split>][-pf]; without -s, auto_split's split (kw: K's words)."""
    from lamina.kernels.wna16_tc import WNA16TCConfig, auto_split

    match = TC_CONFIG_NAME.match(name)
    if not match:
        raise SystemExit(f"--tc-configs: {name!r} is not t<tiles>-c<chunks>[-s<split>][-pf]")
    cfg = WNA16TCConfig(int(match.group(1)), int(match.group(2)), prefetch=bool(match.group(4)))
    return replace(cfg, split=int(match.group(3))) if match.group(3) else auto_split(cfg, n, kw, sms)
