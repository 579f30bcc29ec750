"""Where RePo's kernels run: decided once per device and specialisation, in this one place, thread-safe.

`olmo_repo.rope` asks here before it runs a kernel (`runs`, then the kernel module's `ready`), and so every
backend does through `RepoLayer`; tests and benchmarks ask `runs` too. `OLMO_REPO_KERNELS` sets the process's
policy:

- `0`: the torch path everywhere;
- `check` (the default): the kernels on CUDA, each specialisation checked on its device before it first runs;
- `1`: the kernels on CUDA, unchecked.

A layer's `repo_kernels` (`rope.set_kernels`) overrides where: "torch" never (the torch code: benchmarks compare
the two), "kernels" on every device (CPU tensors under Triton's interpreter, `TRITON_INTERPRET=1`: how the tests
run them), None as above. Whatever the policy, the torch code runs inside torch.compile's tracing (which fuses it:
vLLM's compiled model) and for tensors the kernels do not take (`supports`).

The check runs a kernel, forward and backward, on small inputs of the specialisation Triton compiles for the real
call (the dtypes, sizes, block sizes and flags of the launch, and Triton's own specialisation of its integer and
pointer arguments: equal to 1, divisible by 16, 16-byte aligned), so that the variant it compiles is the one the
real call then runs, and compares it with float64 under fp32 bounds: every output element within half a unit in
the last place of its dtype plus a count of fp32 roundings times the magnitudes involved (a miscompile that moves
a result by 1e-3 of a row's largest element fails by a factor of ten or more). A mismatch, or an error raised by
the kernel, sends that specialisation to the torch path for the rest of the process, with one warning naming it,
the device, Triton's and torch's versions and the size of the mismatch. Like Liger-Kernel's and FlashAttention's
tests of their kernels against a reference, but at run time, once per compiled variant.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "ENV",
    "Agreement",
    "agreement",
    "alike",
    "check_length",
    "forget",
    "int_class",
    "layout",
    "mode",
    "remembered",
    "runs",
    "supports",
    "verdict",
    "wanted",
]

ENV = "OLMO_REPO_KERNELS"
MODES = {"0": "the torch path everywhere", "check": "the kernels on CUDA after a check", "1": "unchecked"}
EPS32 = torch.finfo(torch.float32).eps


@functools.cache
def mode() -> str:
    """`OLMO_REPO_KERNELS` ("check" where unset), read once per process; ValueError naming the allowed values."""
    value = os.environ.get(ENV, "check")
    if value not in MODES:
        allowed = "; ".join(f"{k}: {v}" for k, v in MODES.items())
        raise ValueError(f"{ENV}={value!r} is not one of the allowed values ({allowed})")
    return value


def wanted(where: str | None, device: torch.device) -> bool:
    """Whether a layer asking for `where` (None, "torch" or "kernels") wants the kernels on `device`."""
    if where is None:
        return device.type == "cuda" and mode() != "0"
    return where == "kernels"


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def supports(*tensors: Tensor) -> bool:
    """Whether the kernels take these tensors: fp32, bf16 or fp16 (float64 goes to the reference), and not
    DTensors (tensor parallelism: their sharded layout is the reference's to handle)."""
    return all(t.dtype in _DTYPES and not hasattr(t, "full_tensor") for t in tensors)


def runs(where: str | None, *tensors: Tensor) -> bool:
    """Whether a layer asking for `where` runs the kernels on these tensors (the first one's device): `wanted`
    there, `supports`ed, and not inside torch.compile's tracing. Whether a kernel's variant then runs is its
    module's `ready` (`verdict`)."""
    return not torch.compiler.is_compiling() and supports(*tensors) and wanted(where, tensors[0].device)


@dataclass(frozen=True)
class Agreement:
    """A check's result: its worst output element's |error| and the bound there (`ratio` > 1: a mismatch)."""

    what: str
    error: float
    bound: float

    @property
    def ratio(self) -> float:
        return self.error / self.bound if self.bound > 0 else (0.0 if self.error == 0 else math.inf)


def agreement(
    what: str, got: Tensor, truth: Tensor, fp32_roundings: Tensor | float, magnitude: Tensor
) -> Agreement:
    """`got` against the float64 `truth`: |got - truth| <= its final rounding into got's dtype at |truth| (half an
    ulp: to nearest on a GPU; a whole ulp in Triton's interpreter, which truncates) + fp32_roundings x eps(fp32) x
    magnitude, elementwise. NaN fails."""
    truth = truth.double()
    # |truth| = m 2^e with m in [0.5, 1): an ulp of got's dtype there is eps 2^(e - 1)
    mantissa, exponent = torch.frexp(truth.abs())
    ulps = 0.5 if got.is_cuda else 1.0
    final = torch.finfo(got.dtype).eps * torch.ldexp(torch.full_like(mantissa, ulps), exponent - 1)
    bound = final + torch.as_tensor(fp32_roundings, dtype=torch.float64) * EPS32 * magnitude.double()
    error = torch.nan_to_num((got.double() - truth).abs(), nan=math.inf)
    worst = (error / bound.clamp_min(1e-300)).flatten().argmax()
    return Agreement(what, error.flatten()[worst].item(), bound.expand_as(error).flatten()[worst].item())


def int_class(n: int) -> str:
    """Triton's specialisation of an integer argument: "1", "16" (divisible by 16) or "" (neither)."""
    return "1" if n == 1 else ("16" if n % 16 == 0 else "")


def check_length(n: int, block: int) -> int:
    """A length for a check in n's `int_class` whose launch picks the same block: n where it fits one block, else
    the first such length past one block (a second, partial block, which exercises the masks)."""
    return n if n <= block else 16 * (block // 16 + 1) + n % 16


def layout(t: Tensor) -> tuple:
    """What Triton's specialisation sees of t's layout: its dims in memory order with each stride's `int_class`
    (0 for a broadcast dim), and whether its data is 16-byte aligned."""
    order = sorted(range(t.dim()), key=lambda i: t.stride(i))
    strides = tuple((i, "0" if t.stride(i) == 0 else int_class(t.stride(i))) for i in order)
    return strides, t.data_ptr() % 16 == 0


def alike(t: Tensor, sizes: Sequence[int], gen: torch.Generator, std: float = 1.0) -> Tensor:
    """Normal samples (x std) of `sizes` with t's dtype and device and t's `layout`: dims in t's memory order, each
    stride the first past the dims inside it in the class of t's, size-1 dims keep t's stride, broadcast dims
    stay broadcast; the data offset by one element where t's is not 16-byte aligned."""
    strides, extent = [0] * t.dim(), 1
    for i in sorted(range(t.dim()), key=lambda i: t.stride(i)):
        s = t.stride(i)
        # Broadcast, or one element: the stride moves nothing, but Triton sees its class.
        if s == 0 or sizes[i] == 1:
            strides[i] = s
            continue
        if s == 1 and extent == 1:
            stride = 1
        elif s % 16 == 0:
            stride = -(-extent // 16) * 16
        else:
            stride = max(extent, 2) + (max(extent, 2) % 16 == 0)
        strides[i], extent = stride, stride * sizes[i]
    offset = 0 if t.data_ptr() % 16 == 0 else 1
    span = offset + 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
    data = (torch.randn(span, generator=gen) * std).to(device=t.device, dtype=t.dtype)
    return data.as_strided(tuple(sizes), tuple(strides), offset)


_verdicts: dict[tuple, bool] = {}
_lock = threading.Lock()
_calls: dict[tuple, bool] = {}
CALLS = 4096
"""At most this many call signatures remembered (`remembered`); then they are forgotten and found again."""


def remembered(call: tuple, decide: Callable[[], bool]) -> bool:
    """`decide()` (a `verdict`), remembered for `call`: what a call's inputs look like exactly (shapes, strides,
    dtypes, alignment), cheap to build, so that a call whose verdict is known costs a dictionary lookup rather
    than its specialisation's key."""
    if (known := _calls.get(call)) is None:
        known = decide()
        if len(_calls) >= CALLS:
            _calls.clear()
        _calls[call] = known
    return known


def verdict(key: tuple, check: Callable[[], Sequence[Agreement]], describe: Callable[[], str]) -> bool:
    """Whether the kernels may run at the specialisation `key` (its device first): True without a check where
    `OLMO_REPO_KERNELS=1`, else `check`'s result, computed once per key (the first thread to ask runs it, the
    others wait for it) and kept for the process. A failed check, or one that raises, warns once with
    `describe()`, the device, Triton's and torch's versions and the mismatch."""
    if (known := _verdicts.get(key)) is not None:
        return known
    if mode() == "1":
        return True
    with _lock:
        if (known := _verdicts.get(key)) is None:
            known = _run(key[0], check, describe)
            _verdicts[key] = known
    return known


def forget() -> None:
    """Drop every verdict: the next call of each specialisation is checked again (tests, after changing a
    kernel)."""
    with _lock:
        _verdicts.clear()
        _calls.clear()


def _run(device: torch.device, check: Callable[[], Sequence[Agreement]], describe: Callable[[], str]) -> bool:
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            worst = max(check(), key=lambda a: a.ratio)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # a kernel that does not compile or launch here: the torch path, said once
        problem = f"raised {e!r}"
    else:
        if worst.ratio <= 1.0:
            return True
        problem = (
            f"{worst.what} is off by {worst.error:.3g} where the bound is {worst.bound:.3g} "
            f"({worst.ratio:.3g} times it)"
        )
    import triton  # imported by the kernel modules already

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif os.environ.get("TRITON_INTERPRET") == "1":
        name = f"{device} (Triton's interpreter)"
    else:  # kernels asked for on a CPU without the interpreter: no driver to launch them
        name = f"{device} (no GPU, and TRITON_INTERPRET is not set)"
    warnings.warn(
        f"RePo's {describe()} kernel, checked against float64 on {name} with Triton {triton.__version__} and torch "
        f"{torch.__version__}: {problem}. This specialisation runs the torch path for the rest of the process.",
        RuntimeWarning,
        stacklevel=4,
    )
    return False
