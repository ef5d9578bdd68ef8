"""Probe.from_relax on a hand-built two-function Relax module: names per function, numbered calls,
held weights, per-call dumps.  References are numpy computations of the same maths."""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from tvm_probe import Probe, load_dump  # noqa: E402
from tvm_probe.core.errors import InputError, ModelError, NotRunError, ProbeError, UnknownNameError  # noqa: E402


def two_functions():
    """``encode(x, w) = relu(x @ w) + 1`` and ``normalize(y) = softmax(y)`` (one module)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 3), "float32"))
    with bb.function("encode", [x, w]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w), name_hint="h")
            r = bb.emit(relax.op.nn.relu(h), name_hint="r")
            o = bb.emit_output(relax.op.add(r, relax.const(1.0, "float32")), name_hint="o")
        bb.emit_func_output(o)
    y = relax.Var("y", relax.TensorType((2, 3), "float32"))
    with bb.function("normalize", [y]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(y), name_hint="e")
            s = bb.emit(relax.op.sum(e, axis=[1], keepdims=True), name_hint="s")
            out = bb.emit_output(relax.op.divide(e, s), name_hint="softmax")
        bb.emit_func_output(out)
    return bb.get()


RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 3)).astype("float32")
XS = [RNG.standard_normal((2, 4)).astype("float32") for _ in range(2)]


def encode_ref(x):
    h = x @ W
    return {"h": h, "r": np.maximum(h, 0), "o": np.maximum(h, 0) + 1}


def normalize_ref(y):
    e = np.exp(y)
    return {"e": e, "s": e.sum(1, keepdims=True), "softmax": e / e.sum(1, keepdims=True)}


@pytest.fixture(scope="module", params=["default", "fused"])
def probe(request):
    return Probe.from_relax(two_functions(), params={"w": W}, pipeline=request.param)


def test_every_binding_of_every_function_by_name_per_call(probe):
    assert set(probe.functions) == {"encode", "normalize"}
    start = len(probe.calls)
    outs = []
    for x in XS:
        o = probe.call("encode", x)
        outs.append(probe.call("normalize", o))
    assert list(probe.calls["function"][start:]) == ["encode", "normalize"] * 2
    assert (probe.calls["captured_bytes"][start:] > 0).all()
    for i, x in enumerate(XS):
        enc, norm = start + 2 * i, start + 2 * i + 1
        for name, ref in encode_ref(x).items():
            np.testing.assert_allclose(probe.get(name, call=enc), ref, rtol=1e-5, atol=1e-6)
        for name, ref in normalize_ref(encode_ref(x)["o"]).items():
            np.testing.assert_allclose(probe.get(name, call=norm), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[i].numpy(), normalize_ref(encode_ref(x)["o"])["softmax"], rtol=1e-5)
    # the default call is the last one; names resolve within its function
    np.testing.assert_allclose(probe.get("softmax"), normalize_ref(encode_ref(XS[-1])["o"])["softmax"], rtol=1e-5)
    with pytest.raises(UnknownNameError, match="'h'"):
        probe.get("h")  # a name of encode, not of normalize
    np.testing.assert_array_equal(probe.get("w", call=start), W)  # a held weight, by its name
    np.testing.assert_array_equal(probe.get("x", call=start), XS[0])


def test_bad_calls_are_one_line_errors(probe):
    with pytest.raises(ProbeError, match="no function 'decode'.*encode"):
        probe.call("decode", XS[0])
    with pytest.raises(InputError, match=r"encode\(\) takes 1 argument.*got 2"):
        probe.call("encode", XS[0], W)  # w is held by the probe
    with pytest.raises(InputError):
        probe.call("encode", XS[0][:1])
    with pytest.raises(ProbeError, match="there is no call 99"):
        probe.get("h", call=99)
    with pytest.raises(ProbeError, match="2 functions.*probe.call"):
        probe.run({"x": XS[0]})


def test_errors_before_any_call_and_for_unknown_params():
    with pytest.raises(ModelError, match="params names no parameter: 'nope'"):
        Probe.from_relax(two_functions(), params={"nope": W})
    p = Probe.from_relax(two_functions())
    with pytest.raises(NotRunError, match="probe.call"):
        p.get("h", call=0)
    # without params=, the caller passes the weight as the compiled function takes it
    p.call("encode", XS[0], W)
    np.testing.assert_allclose(p.get("o"), encode_ref(XS[0])["o"], rtol=1e-5)


def test_single_function_module_runs_as_before():
    mod = tvm.IRModule({"main": two_functions()["normalize"].with_attr("global_symbol", "main")})
    p = Probe.from_relax(mod, pipeline="fused")
    y = XS[0][:, :3].copy()
    out = p.run({"y": y})
    ref = normalize_ref(y)
    np.testing.assert_allclose(list(out.values())[0], ref["softmax"], rtol=1e-5)
    np.testing.assert_allclose(p.get("e"), ref["e"], rtol=1e-5)


def test_dump_keeps_every_call(probe, tmp_path):
    probe.call("encode", XS[0])
    probe.call("normalize", probe.call("encode", XS[1]))
    root = probe.dump(tmp_path / "d")
    n = len(probe.calls)
    index = load_dump(root / "calls" / f"{n - 1:04d}_normalize")
    np.testing.assert_allclose(index.get("softmax"), normalize_ref(encode_ref(XS[1])["o"])["softmax"], rtol=1e-5)
    first = load_dump(root / "calls" / f"{n - 3:04d}_encode")
    np.testing.assert_allclose(first.get("o"), encode_ref(XS[0])["o"], rtol=1e-5)
    import json

    listed = json.loads((root / "calls.json").read_text())
    assert [c["function"] for c in listed["calls"]][-3:] == ["encode", "encode", "normalize"]


def test_forgotten_calls_say_so():
    p = Probe.from_relax(two_functions(), params={"w": W})
    p.call("encode", XS[0])
    p.call("encode", XS[1])
    p.forget_calls(keep_last=1)
    with pytest.raises(NotRunError, match="call 0 .*forgotten"):
        p.get("o", call=0)
    np.testing.assert_allclose(p.get("o"), encode_ref(XS[1])["o"], rtol=1e-5)
    # forgetting again, keeping more than before, brings nothing back and keeps what was kept
    p.call("encode", XS[0])
    p.forget_calls(keep_last=3)
    with pytest.raises(NotRunError, match="call 0 .*forgotten"):
        p.get("o", call=0)
    np.testing.assert_allclose(p.get("o", call=1), encode_ref(XS[1])["o"], rtol=1e-5)
    p.forget_calls(keep_last=1)
    with pytest.raises(NotRunError, match="call 1 .*forgotten"):
        p.get("o", call=1)
    np.testing.assert_allclose(p.get("o", call=2), encode_ref(XS[0])["o"], rtol=1e-5)


def test_selective_capture_across_functions():
    """capture=[one name], call after call: later calls may run in a VM where only the wanted
    kernel is hooked; that VM must still resolve the other functions' kernels."""
    p = Probe.from_relax(two_functions(), params={"w": W})
    for x in XS * 2:
        o = p.call("encode", x, capture=["h"])
        np.testing.assert_allclose(p.get("h"), encode_ref(x)["h"], rtol=1e-5, atol=1e-6)
        p.call("normalize", o, capture=["e"])
        np.testing.assert_allclose(p.get("e"), normalize_ref(encode_ref(x)["o"])["e"], rtol=1e-5)
    with pytest.raises(ProbeError, match="not captured"):
        p.get("r", call=len(p.calls) - 2)  # encode's, not asked for


@pytest.mark.parametrize("pipeline", ["default", "fused"])
def test_repeated_calls_with_tensors_keep_every_calls_values(pipeline):
    """A call repeated with the same selection and arguments passed as tensors runs through the
    executor's prepared FastCall; each call's values stay its own (their copies are cut from
    shared chunks of memory) and equal numpy's maths."""
    from tvm_probe.capture.kernel_hook import HOOK

    p = Probe.from_relax(two_functions(), params={"w": W}, pipeline=pipeline)
    xs = [RNG.standard_normal((2, 4)).astype("float32") for _ in range(6)]
    for x in xs:
        p.call("encode", tvm.runtime.tensor(x), capture=["h", "r"])
    assert p.functions["encode"]._executor.fast_calls, "later calls did not take the prepared path"
    assert p.call_record().capture.instrument == HOOK
    for k, x in enumerate(xs):
        for name in ("h", "r"):
            np.testing.assert_allclose(p.get(name, call=k), encode_ref(x)[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name}, call {k}")


def test_a_prepared_call_that_sees_other_kernel_calls_is_not_repeated():
    """A hooked call whose kernels were called other than the kernel map says has run already:
    what it was given as it is (tensors, a KV cache) may have changed, so it is refused in one
    line instead of being run a second time; later calls go through TVM's instrument."""
    from tvm_probe.core.errors import TVMBehaviourChanged
    from tvm_probe.capture.kernel_hook import HOOK
    from tvm_probe.capture.native import EXPECTED

    p = Probe.from_relax(two_functions(), params={"w": W})
    x = tvm.runtime.tensor(XS[0])
    for _ in range(3):
        p.call("encode", x, capture=["h"])
    (fast,) = p.functions["encode"]._executor.fast_calls.values()
    fast._expected += 1  # as if TVM called the hooked kernel once less than the map has it
    (direct,) = [entry[-1] for entry in p._fast_calls.values()]  # (the same call, in one native call)
    direct._status[EXPECTED] += 1
    with pytest.raises(TVMBehaviourChanged, match="not repeated"):
        p.call("encode", x, capture=["h"])
    p.call("encode", x, capture=["h"])
    assert p.call_record().capture.instrument != HOOK
    np.testing.assert_allclose(p.get("h"), encode_ref(XS[0])["h"], rtol=1e-5, atol=1e-6)


def test_set_params_swaps_a_held_weight_without_a_rebuild():
    p = Probe.from_relax(two_functions(), params={"w": W})
    p.call("encode", XS[0])
    executable = p.built.executable
    W2 = (W * -2).astype("float32")
    p.set_params({"w": W2})
    assert p.built.executable is executable and p.num_calls == 1
    with pytest.raises(ProbeError):  # the earlier call ran with the old weight: forgotten
        p.get("h", call=0)
    for _ in range(3):  # the prepared fast call too takes the new weight
        p.call("encode", XS[1])
    np.testing.assert_allclose(p.get("h"), XS[1] @ W2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(p.get("w"), W2)
    with pytest.raises(ProbeError, match="holds no weight 'nope'|holds no weight nope"):
        p.set_params({"nope": W})
    with pytest.raises(ModelError, match=r"w takes float32\[4, 3\], got float32\[3, 4\]"):
        p.set_params({"w": W.T.copy()})
