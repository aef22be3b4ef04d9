"""The numpy emulations of the prefill attention kernels (scripts/prefill_kernel_emulation.py: the portable
mma.sync kernel; scripts/prefill_hopper_emulation.py: the Hopper wgmma kernel) run their cases: a check of the
kernels' index logic (fragment layouts, swizzles, descriptors, masking, splits) that needs no GPU."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["prefill_kernel_emulation", "prefill_hopper_emulation"])
def test_emulation_cases_pass(name):
    _load(name).main()  # asserts every case: no unwritten output, nmse < 1e-5 against float64


def test_hopper_emulation_catches_a_wrong_descriptor():
    mod = _load("prefill_hopper_emulation")
    right = mod.Smem.n_major

    def swapped(self, start, lead, n_cols):  # leading and stride offsets exchanged
        out = mod.np.empty((16, n_cols), dtype=mod.np.float32)
        for k in range(16):
            for n in range(n_cols):
                a = start + (n % 64) * 2 + (n // 64) * 1024 + (k % 8) * 128 + (k // 8) * lead
                out[k, n] = self.a[mod.swizzle(a) // 2]
        return out

    mod.Smem.n_major = swapped
    try:
        with pytest.raises(AssertionError):
            mod.run(1, 4, 0, 40, 1, 1)
    finally:
        mod.Smem.n_major = right
