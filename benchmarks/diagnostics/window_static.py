"""What the sliding-window kernels cost in registers, spills and shared memory, per launch shape,
read from the compiler alone: no GPU needed (Triton compiles for sm_90a, its bundled ``ptxas -v``
reports), and whether the loads are software-pipelined (``async ld``: asynchronous copies; ``tma
ld``: bulk tensor copies). Kernels are compiled as a launch specializes them (16-byte aligned
tensors, sizes and strides multiples of 16): without those hints the loads are neither
vectorized nor pipelined, and the counts would describe kernels that never run.

  python3 benchmarks/diagnostics/window_static.py                       # head dim 128, every built-in shape
  python3 benchmarks/diagnostics/window_static.py --dim 64 --kernels dkdv --dkdv-shapes 64x32/w4/s2 128x32/w8/s2
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE), _HERE]  # repo, benchmarks/, here

from window_tune import DKDV, DQ, FIELDS, FWD, parse_blocks  # noqa: E402

from kernels.attention import window_triton as wt  # noqa: E402

KERNELS = {"fwd": ("_fwd", FWD), "dkdv": ("_bwd_dkdv", DKDV), "dq": ("_bwd_dq", DQ),
           "dqds": ("_bwd_dq_from_ds", DKDV)}
_POINTERS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "DS")
_FLOAT32_POINTERS = ("LSE", "DELTA")
#: integer arguments that are not multiples of 16 at the benchmark shape (query heads per kv head)
_SMALL_INTS = ("GROUP",)


def ptxas_path() -> str | None:
    """The ptxas Triton compiles for: ``TRITON_PTXAS_PATH`` when set, else its bundled one.

    Triton writes PTX of the ISA version that assembler takes, so the report must use the same
    one: TorchInductor sets ``TRITON_PTXAS_PATH`` to torch's own (newer) ptxas in any process
    that compiled with it, and Triton's bundled 12.8 ptxas then refused the PTX (seen on the
    H200 inside the kernels test suite)."""
    if wt.triton is None:
        return None
    try:
        path = wt.triton.knobs.nvidia.ptxas.path
    except Exception:  # no usable ptxas at all
        return None
    return path if path and os.access(path, os.X_OK) else None


def resources(kernel: str, blocks: wt.Blocks, head_dim: int, arch: int = 90, store_ds: bool = True,
              transposed: bool = False) -> dict[str, Any]:
    """Compile one kernel at one launch shape for ``sm_<arch>a`` (bf16 inputs) and read ptxas's report."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(wt, KERNELS[kernel][0])
    consts: dict[str, Any] = {"D": head_dim, "BLOCK_M": blocks.block_m, "BLOCK_N": blocks.block_n}
    names = fn.arg_names
    if "STORE_DS" in names:
        consts["STORE_DS"] = store_ds
    if "TMA" in names:
        consts["TMA"] = blocks.tma
    if "TRANSPOSED" in names:
        consts["TRANSPOSED"] = transposed
    if "DS_T" in names:
        consts["DS_T"] = transposed
    signature = {n: "constexpr" if n in consts else "*bf16" if n in _POINTERS else "*fp32" if n in _FLOAT32_POINTERS
                 else "fp32" if n == "sm_scale" else "i32" for n in names}
    if blocks.tma:  # the loaded operands are descriptors of (rows per tile) x D tiles
        tile_rows = {"Q": blocks.block_m, "DO": blocks.block_m, "K": blocks.block_n, "V": blocks.block_n}
        signature.update({n: f"tensordesc<bf16[{rows}, {head_dim}]>" for n, rows in tile_rows.items() if n in names})
    # what a launch specializes on: tensors 16-byte aligned, sizes and strides multiples of 16
    # (S=32768, window 256, contiguous heads). Without these hints the loads are not vectorized
    # and not software-pipelined, and the report describes a kernel that never runs.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n].startswith("*") or (signature[n] == "i32" and n not in _SMALL_INTS)}
    src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs=attrs)
    compiled = wt.triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                 options={"num_warps": blocks.warps, "num_stages": blocks.stages})
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        done = subprocess.run([ptxas_path() or "ptxas", "-v", f"--gpu-name=sm_{arch}a", ptx, "-o",
                               os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
        if done.returncode != 0:  # the assembler's own words, not only its exit status
            raise RuntimeError(f"ptxas exited {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
        report = done.stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        return int(found.group(1)) if found else 0

    ttgir = compiled.asm["ttgir"]
    return {"kernel": kernel, "blocks": str(blocks),
            "head_dim": head_dim, "registers": number(r"Used (\d+) registers"),
            "async_copies": ttgir.count("ttg.async_copy_global_to_local"),
            "tma_copies": ttgir.count("ttng.async_tma_copy_global_to_local"),
            "spill_stores": number(r"(\d+) bytes spill stores"), "spill_loads": number(r"(\d+) bytes spill loads"),
            "shared_bytes": compiled.metadata.shared}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    for kernel in KERNELS:
        ap.add_argument(f"--{kernel}-shapes", nargs="+", type=parse_blocks, default=None, metavar="MxN/wW/sS")
    ap.add_argument("--dkdv-transposed", action=argparse.BooleanOptionalAction, default=None,
                    help="the dK/dV kernel on transposed tiles (default: as the shipped configuration)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.dkdv_transposed is None:
        args.dkdv_transposed = wt.nearest_gpu_config(args.dim).dkdv_transposed
    if ptxas_path() is None:
        print("window_static: needs a ptxas (Triton's bundled one, or TRITON_PTXAS_PATH)", file=sys.stderr)
        return 2
    rows = []
    for kernel in args.kernels:
        for blocks in getattr(args, f"{kernel}_shapes") or KERNELS[kernel][1]:
            try:
                rows.append(resources(kernel, blocks, args.dim, transposed=args.dkdv_transposed))
            except Exception as exc:  # a shape the compiler rejects is a row too
                rows.append({"kernel": kernel, "blocks": str(blocks), "head_dim": args.dim,
                             "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]})
            print("[row]", json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    shipped = wt.GPU_CONFIGS.get(args.dim)
    print(f"\nwindow_static  sm_90a  head dim {args.dim}  (spills in bytes per thread; * = shipped shape)")
    print(f"{'kernel':<6} {'shape':<16} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'shared KiB':>10} {'async ld':>8} {'tma ld':>6}")
    for r in sorted(rows, key=lambda r: (r["kernel"], r.get("spill_stores", 1 << 30), r["blocks"])):
        field = FIELDS[r["kernel"].removesuffix("+delta")]
        mark = "*" if shipped is not None and r["blocks"] == str(getattr(shipped, field)) else " "
        if "error" in r:
            print(f"{r['kernel']:<6} {r['blocks']:<15}{mark} {r['error']}")
        else:
            print(f"{r['kernel']:<6} {r['blocks']:<15}{mark} {r['registers']:>5} {r['spill_stores']:>9} "
                  f"{r['spill_loads']:>9} {r['shared_bytes'] / 1024:>10.1f} {r['async_copies']:>8} {r['tma_copies']:>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
