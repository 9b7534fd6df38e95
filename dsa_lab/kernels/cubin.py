"""What the GPU compiler made of a kernel, read from its cubin and PTX: no GPU needed.

The ahead-of-time tests and `dsa-lab env --aot` (`kernels.aot`) ask the same questions of a
compiled kernel (registers, spills, shared memory, which MMA instructions ptxas emitted), so they
read them here, with the cuobjdump that Triton ships.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from typing import Any


def cuobjdump(cubin: bytes, flag: str) -> str:
    """Triton's own cuobjdump on a cubin, e.g. `-sass` or `-res-usage`."""
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [triton.knobs.nvidia.cuobjdump.path, flag, f.name], capture_output=True, text=True, check=True
        ).stdout


def resource_counts(kernel: Any) -> dict[str, Any]:
    """Registers, spills (stack, local memory, LDL/STL), shared memory and the MMA/TMA instructions
    of a compiled Triton or Gluon kernel (`triton.compile(...)` or a launched kernel's handle)."""
    usage = cuobjdump(kernel.asm["cubin"], "-res-usage")
    sass = cuobjdump(kernel.asm["cubin"], "-sass")
    ptx = kernel.asm["ptx"]
    fields = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage))
    return {
        "registers": int(fields["REG"]),
        "stack_bytes": int(fields["STACK"]),
        "local_bytes": int(fields["LOCAL"]),
        "sass_local_accesses": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
        "shared_bytes": kernel.metadata.shared,
        "ptx_wgmma_e4m3": len(re.findall(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx)),
        "sass_qgmma_e4m3": len(re.findall(r"\bQGMMA\.\S*E4M3\.E4M3", sass)),
        "ptx_tcgen05_f8": len(re.findall(r"tcgen05\.mma\S*kind::f8f6f4", ptx)),
        "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        "tma_loads": len(re.findall(r"\bUTMALDG\b", sass)),
    }
