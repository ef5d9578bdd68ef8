"""Runs that observe only the kernels they need (tvm_probe.capture.kernel_hook), and a user's own
instrument (tvm_probe.capture.instrument): both checked against what TVM's instrument captures."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tvm_probe.capture.instrument import Instrument
from tvm_probe.core.sources import Served



def test_a_run_capturing_nothing_observes_no_kernel(probed, bert_inputs):
    probe, outputs, _ = probed
    again = probe.run(bert_inputs, capture=None)
    assert probe.instrument == "kernel hook"
    assert probe._executor._hooked[frozenset()].hooked == frozenset()
    for name, value in outputs.items():
        np.testing.assert_array_equal(again[name], value)


def test_selected_values_through_the_hook_equal_the_instrument_run(probed, bert_inputs):
    probe, _, served = probed
    keys = sorted(served)
    rng = random.Random(7)
    hooked = 0
    for _ in range(12):
        wanted = rng.sample(keys, rng.randint(1, 2))
        probe.run(bert_inputs, capture=wanted)
        hooked += probe.instrument == "kernel hook"
        for key in wanted:
            np.testing.assert_array_equal(probe.get_tensor(key), served[key], err_msg=key)
    assert hooked >= 6, "most one- or two-value selections need only a few kernels"


def test_a_value_kept_inside_a_kernel_is_recomputed_from_hooked_inputs(probed, bert_inputs):
    probe, _, served = probed
    interior = [k for k in served if probe.servings[k].served is Served.RECOMPUTED]
    if not interior:
        pytest.skip("this pipeline fuses nothing away")
    probe.run(bert_inputs, capture=[interior[0]])
    assert probe.instrument == "kernel hook"
    np.testing.assert_allclose(probe.get_tensor(interior[0]), served[interior[0]], rtol=1e-6, atol=1e-6)


def test_kernel_times_time_every_kernel_call(probed, bert_inputs):
    probe, _, served = probed
    key = next(iter(served))
    probe.run(bert_inputs, capture=[key], kernel_times=True)
    # native hooks on every kernel (views included) where the native library is built, else TVM's instrument
    assert probe.instrument in ("native", "python", "kernel hook")
    assert probe.nodes["time_us"].iloc[probe.num_input_nodes:].notna().all()
    np.testing.assert_array_equal(probe.get_tensor(key), served[key])


def test_the_global_registry_is_left_as_it_was(probed):
    import tvm_ffi

    probe, _, _ = probed
    assert probe._executor._hooked, "hooked VMs were made"
    for site in probe.kernel_map.sites:
        if not site.symbol.startswith("vm.builtin."):
            assert tvm_ffi.get_global_func(site.symbol, allow_missing=True) is None, site.symbol
    for symbol, function in BUILTINS.items():  # hooked views: TVM's own functions are back
        assert tvm_ffi.get_global_func(symbol).same_as(function), symbol


#: VM builtins as TVM registered them, before any hooked VM was made (a view is a builtin call)
BUILTINS = {}


@pytest.fixture(scope="module", autouse=True)
def _builtins_before():
    import tvm  # noqa: F401  (registers the VM builtins)
    import tvm_ffi

    for symbol in ("vm.builtin.reshape", "vm.builtin.null_value"):
        BUILTINS[symbol] = tvm_ffi.get_global_func(symbol)


class Recorder(Instrument):
    def __init__(self):
        self.resets, self.before, self.after = 0, [], {}

    def reset(self):
        self.resets += 1
        self.before, self.after = [], {}

    def before_call(self, call):
        self.before.append(call.site)

    def after_call(self, call):
        self.after[call.site] = (call.names, call.output_arrays(), call.time_us)


def test_a_users_instrument_sees_every_kernel_call_with_its_source_names(probed, bert_inputs):
    probe, _, served = probed
    recorder = Recorder()
    probe.run(bert_inputs, capture="all", instrument=recorder)
    probe.run(bert_inputs, capture="all", instrument=recorder)
    assert recorder.resets == 2
    sites = probe.kernel_map.sites
    assert recorder.before == [s.index for s in sites]
    for site in sites:
        names, arrays, time_us = recorder.after[site.index]
        assert time_us is not None and time_us >= 0
        for k, keys in enumerate(site.output_keys):
            assert names[k] == [probe.sources_map[key].display_name for key in keys]
            for key in keys:
                if key in served:
                    np.testing.assert_array_equal(arrays[k], served[key], err_msg=key)


class Exploding(Instrument):
    def after_call(self, call):
        if call.site == 3:
            raise ValueError("stop at the fourth kernel")


def test_an_instrument_that_raises_stops_the_run_with_its_own_error(probed, bert_inputs):
    probe, outputs, _ = probed
    with pytest.raises(ValueError, match="stop at the fourth kernel"):
        probe.run(bert_inputs, capture=None, instrument=Exploding())
    again = probe.run(bert_inputs)  # the probe still runs
    for name, value in outputs.items():
        np.testing.assert_array_equal(again[name], value)
