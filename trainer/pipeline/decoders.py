"""Which codec --decode gpu uses: DDPTUI_DECODER and DDPTUI_NVIMGCODEC, their check (torch-free:
the CLI runs it before any rank starts), and whether nvImageCodec is installed.
"""

from __future__ import annotations

import importlib.util

DECODERS = ("torchvision", "engines", "nvimgcodec")  # DDPTUI_DECODER, for --decode gpu
NVIMGCODEC_WORDS = ("hw", "gpu", "hybrid", "all", "whole")  # DDPTUI_NVIMGCODEC, comma-separated


def nvimgcodec_installed() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ModuleNotFoundError:  # no `nvidia` package at all
        return False


def decoder_env_problem(env) -> str | None:
    """What is wrong with the variables that choose and tune --decode gpu's codec (read by the
    ranks), or None."""
    decoder = env.get("DDPTUI_DECODER", "")
    if decoder and decoder not in DECODERS:
        return f"DDPTUI_DECODER={decoder}: expected one of {', '.join(DECODERS)}"
    words = [w for w in env.get("DDPTUI_NVIMGCODEC", "").replace(" ", "").split(",") if w]
    unknown = [w for w in words if w not in NVIMGCODEC_WORDS]
    if unknown:
        return (f"DDPTUI_NVIMGCODEC: unknown {', '.join(unknown)} (words: "
                f"{', '.join(NVIMGCODEC_WORDS)}, comma-separated)")
    if decoder == "nvimgcodec" and not nvimgcodec_installed():
        return "DDPTUI_DECODER=nvimgcodec needs nvImageCodec: pip install 'ddptui[nvimgcodec]'"
    return None
