"""Native kernel hooks (tvm_probe/capture/native, tvm_probe/capture/kernel_hook.py): runs after a probe's first
one go through a VM whose observed kernels are C++ wrappers reporting to the native capture
session, with no TVM instrument.  Checked against what TVM's instrument captured, value by value
and time by time, and against the ways such a run can go wrong."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe import Probe
from tvm_probe.capture.kernel_hook import HOOK
from tvm_probe.core.sources import Served


@pytest.fixture(autouse=True)
def _needs_native(probed):
    if probed[0]._executor.instrument != "native":
        pytest.skip(f"the native library is unavailable here: {probed[0]._executor.fallback_reason}")


def test_everything_through_native_hooks_equals_the_instrument_run(probed, bert_inputs):
    probe, outputs, served = probed
    again = probe.run(bert_inputs)
    assert probe.instrument == HOOK and probe._executor._hook_of, "the second run goes through hooks"
    hooked = next(vm for vm in probe._executor._hooked.values() if vm.switch is not None and vm.hooked)
    assert hooked.hooked >= {s.symbol for s in probe.kernel_map.sites}, "every kernel (and view) is hooked"
    for name, value in outputs.items():
        np.testing.assert_array_equal(again[name], value)
    for key, value in served.items():
        np.testing.assert_array_equal(probe.get_tensor(key), value, err_msg=key)
    times = probe.nodes["time_us"].iloc[probe.num_input_nodes:]
    assert times.notna().all() and (times >= 0).all()


def test_views_are_captured_through_their_hooked_builtin(probed, bert_inputs):
    probe, _, served = probed
    views = [s for s in probe.kernel_map.sites if s.is_view]
    if not views:
        pytest.skip("this pipeline leaves no view call")
    probe.run(bert_inputs, capture="all")
    for site in views:
        got = probe.get_node_output(probe.num_input_nodes + site.index)
        assert got.shape == tuple(site.out_shapes[0])
        for key in site.output_keys[0]:
            if key in served:
                np.testing.assert_array_equal(got, served[key], err_msg=key)


def test_a_selection_copies_only_its_kernels(probed, bert_inputs):
    probe, _, served = probed
    captured = [k for k in served if probe.servings[k].served is Served.CAPTURED]
    wanted = captured[len(captured) // 2]
    probe.run(bert_inputs, capture=[wanted])
    assert probe.instrument == HOOK
    np.testing.assert_array_equal(probe.get_tensor(wanted), served[wanted])
    copied = probe._capture.outputs
    assert 0 < len(copied) < len(probe.kernel_map.sites)


def test_a_hook_run_that_sees_other_calls_than_the_map_is_redone_through_the_instrument(probed, bert_inputs):
    """Hooked runs check the hooked kernels' call counts; a count that is off (here: a hooked VM
    expecting one call more than the VM makes, as if TVM's calls had changed) sends the run back
    through TVM's instrument, which checks every call, and later runs keep to the instrument."""
    probe, _, served = probed
    executor = probe._executor
    probe.run(bert_inputs)
    assert probe.instrument == HOOK
    vm = executor._hook_of[(probe._planner.plan("all")[0], False)]
    vm.expected_calls += 1
    probe.run(bert_inputs)
    assert probe.instrument != HOOK and not executor._hook_allowed
    for key, value in served.items():
        np.testing.assert_array_equal(probe.get_tensor(key), value, err_msg=key)
    executor._hook_allowed = True  # (for the module's other tests: the tampered VM is gone)
    assert vm not in executor._hooked.values()


def _views_of_the_input():
    """``main(x) = (reshape(x), x * 2)``: its first result is a view of its argument."""
    import tvm  # noqa: F401
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            view = bb.emit(relax.op.reshape(x, (3, 2)), name_hint="view")
            twice = bb.emit(relax.op.multiply(x, relax.const(2.0, "float32")), name_hint="twice")
            out = bb.emit_output(relax.Tuple([view, twice]), name_hint="out")
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("capture", [None, "all"])
def test_a_returned_view_of_an_input_survives_the_next_call(capture):
    """probe.call copies numpy arguments into tensors it keeps for the next call; a result that
    refers to one (a view of the argument) makes it give that tensor up, so what the caller
    holds is never overwritten by a later call."""
    probe = Probe.from_relax(_views_of_the_input())
    first = np.arange(6, dtype="float32").reshape(2, 3)
    kept = [probe.call("main", first + 100 * k, capture=capture) for k in range(4)]  # (first: instrument)
    if capture is None:  # the later calls took the prepared call (numpy copied into its held tensors)
        assert probe.functions["main"]._executor.fast_calls
    for k, (view, twice) in enumerate(kept):
        np.testing.assert_array_equal(view.numpy(), (first + 100 * k).reshape(3, 2), err_msg=f"call {k}")
        np.testing.assert_array_equal(twice.numpy(), 2 * (first + 100 * k), err_msg=f"call {k}")
        np.testing.assert_array_equal(probe.get("x", call=k), first + 100 * k)
