from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from tuneforge.tune.specs import TensorSpec, example_input, example_inputs, key_of, preserve_rng_state


def _same_np_state(a: Any, b: Any) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])


# ---------------------------------------------------------------- TensorSpec.of (numpy)

def test_of_contiguous() -> None:
    spec = TensorSpec.of(np.zeros((4, 5), dtype=np.float32))
    assert spec == TensorSpec("float32", (4, 5), (5, 1), 0, "cpu", None, "numpy")
    assert spec.is_contiguous() and spec.numel == 20 and spec.itemsize == 4 and spec.storage_size == 20


def test_of_transposed() -> None:
    spec = TensorSpec.of(np.zeros((4, 5), dtype=np.float64).T)
    assert (spec.dtype, spec.sizes, spec.strides, spec.offset) == ("float64", (5, 4), (1, 5), 0)
    assert not spec.is_contiguous()


def test_of_sliced_view_has_offset() -> None:
    base = np.zeros((10, 10), dtype=np.float32)
    spec = TensorSpec.of(base[1:, 2:])
    assert (spec.sizes, spec.strides, spec.offset) == ((9, 8), (10, 1), 12)
    assert spec.storage_size == 12 + 8 * 10 + 7 * 1 + 1
    # a view of a view still measures from the root buffer
    assert TensorSpec.of(base[1:, 2:][3:, 1::2]).offset == 12 + 3 * 10 + 1
    assert TensorSpec.of(base[1:, 2:][3:, 1::2]).strides == (10, 2)


def test_of_as_strided_view_offset() -> None:
    storage = np.arange(40, dtype=np.int64)
    view = np.lib.stride_tricks.as_strided(storage[7:], (3, 4), (8 * 8, 8))
    spec = TensorSpec.of(view)
    assert (spec.dtype, spec.sizes, spec.strides, spec.offset) == ("int64", (3, 4), (8, 1), 7)


def test_of_zero_stride_broadcast() -> None:
    spec = TensorSpec.of(np.broadcast_to(np.arange(3.0), (4, 3)))
    assert spec.sizes == (4, 3) and spec.strides == (0, 1) and spec.offset == 0
    assert spec.storage_size == 3


def test_of_negative_stride_rejected() -> None:
    with pytest.raises(ValueError, match="negative strides"):
        TensorSpec.of(np.arange(6.0)[::-1])


def test_of_stride_not_multiple_of_itemsize_rejected() -> None:
    raw = np.zeros(40, dtype=np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw.view(np.float32), (3,), (6,))
    with pytest.raises(ValueError, match="multiple of"):
        TensorSpec.of(odd)


def test_of_owned_array_and_spec_passthrough_and_scalar() -> None:
    arr = np.ones(3, dtype=np.int32)
    assert TensorSpec.of(arr).offset == 0
    spec = TensorSpec.contiguous((2, 3))
    assert TensorSpec.of(spec) is spec
    assert TensorSpec.of(np.float64(1.0)) == TensorSpec("float64", (), ())
    with pytest.raises(TypeError, match="numpy array"):
        TensorSpec.of([1, 2, 3])


def test_contiguous_and_text() -> None:
    spec = TensorSpec.contiguous((512, 256))
    assert spec.strides == (256, 1) and spec.dtype == "float32" and spec.framework == "numpy"
    assert spec.sizes_text() == "512x256"
    assert spec.describe() == "float32[512x256]"
    assert TensorSpec("float32", (512, 256), (256, 1), 8).describe() == "float32[512x256 @256,1 +8]"
    assert TensorSpec("float32", (512, 256), (1, 512)).describe() == "float32[512x256 @1,512]"
    assert TensorSpec.contiguous((), "int64").sizes_text() == "scalar"
    assert TensorSpec.contiguous((3, 0, 2)).strides == (2, 2, 1)


def test_spec_validation_and_dtype_normalisation() -> None:
    assert TensorSpec(np.float32, (2,), (1,)).dtype == "float32"  # type: ignore[arg-type]
    assert TensorSpec("torch.int64", (2,), (1,)).dtype == "int64"
    assert TensorSpec("float32", [2, 3], [3, 1]).sizes == (2, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strides"):
        TensorSpec("float32", (2, 3), (1,))
    with pytest.raises(ValueError, match="negative stride"):
        TensorSpec("float32", (2,), (-1,))
    # bfloat16 and non-CPU devices are torch's
    assert TensorSpec("bfloat16", (2,), (1,)).framework == "torch"
    assert TensorSpec("bfloat16", (2,), (1,)).itemsize == 2
    assert TensorSpec("float32", (2,), (1,), device="cuda", device_index=0).framework == "torch"
    with pytest.raises(ValueError, match="CPU"):
        TensorSpec("float32", (2,), (1,), device="cuda", framework="numpy")


def test_is_contiguous_ignores_size_one_dims() -> None:
    assert TensorSpec("float32", (4, 1, 3), (3, 99, 1)).is_contiguous()
    assert TensorSpec("float32", (0, 3), (0, 0)).is_contiguous()
    assert not TensorSpec("float32", (4, 3), (4, 1)).is_contiguous()


# ---------------------------------------------------------------- key_of

def test_key_of_changes_with_each_layout_field_but_not_device_index() -> None:
    spec = TensorSpec("float32", (4, 5), (5, 1), 0, "cuda", 0)
    base = key_of(spec)
    assert key_of(TensorSpec("float32", (4, 5), (5, 1), 0, "cuda", 3)) == base
    changed = [
        TensorSpec("float16", (4, 5), (5, 1), 0, "cuda", 0),
        TensorSpec("float32", (4, 6), (5, 1), 0, "cuda", 0),
        TensorSpec("float32", (4, 5), (6, 1), 0, "cuda", 0),
        TensorSpec("float32", (4, 5), (5, 1), 1, "cuda", 0),
        TensorSpec("float32", (4, 5), (5, 1), 0, "xpu", 0),
    ]
    keys = [key_of(s) for s in changed]
    assert all(k != base for k in keys)
    assert len(set(keys)) == len(keys)
    assert key_of(TensorSpec.contiguous((4, 5), framework="numpy")) == key_of(
        TensorSpec.contiguous((4, 5), framework="torch"))


# ---------------------------------------------------------------- example inputs

LAYOUTS = [
    TensorSpec.contiguous((8, 6)),
    TensorSpec("float64", (6, 8), (1, 6)),  # transposed
    TensorSpec("float32", (5, 4), (10, 1), 12),  # sliced view with offset
    TensorSpec("float32", (3, 4), (1, 3), 5),  # transposed with offset
    TensorSpec("float32", (4, 3), (0, 1), 2),  # broadcast
    TensorSpec("int64", (7,), (2,), 3),
    TensorSpec("uint8", (2, 2), (2, 1)),
    TensorSpec("bool", (3, 3), (3, 1), 1),
    TensorSpec("float16", (2, 3, 4), (12, 1, 3)),
    TensorSpec("complex64", (3,), (1,)),
    TensorSpec("float32", (0, 3), (3, 1), 4),  # empty
    TensorSpec("float32", (), (), 2),  # scalar
]


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.describe())
def test_example_input_has_exactly_the_spec_layout(spec: TensorSpec) -> None:
    value = example_input(spec, seed=3)
    assert isinstance(value, np.ndarray)
    assert TensorSpec.of(value) == spec
    assert value.dtype == np.dtype(spec.dtype)
    assert value.base is not None and value.base.size >= spec.storage_size


def test_example_values_by_dtype() -> None:
    for dtype in ("float32", "float64", "float16"):
        floats = example_input(TensorSpec.contiguous((2000,), dtype), seed=1)
        assert floats.dtype == np.dtype(dtype)
        assert abs(float(floats.mean())) < 0.2 and 0.8 < float(floats.std()) < 1.2, dtype
        assert len(np.unique(floats)) > 1000, dtype  # drawn, not tiled
    ints = example_input(TensorSpec.contiguous((2000,), "int32"))
    assert ints.min() == -8 and ints.max() == 8
    uints = example_input(TensorSpec.contiguous((2000,), "uint16"))
    assert uints.min() == 0 and uints.max() == 16
    bools = example_input(TensorSpec.contiguous((200,), "bool"))
    assert bools.any() and not bools.all()
    with pytest.raises(ValueError, match="random example values"):
        example_input(TensorSpec.contiguous((2,), "datetime64[s]"))


def test_seeds_are_reproducible_and_distinct() -> None:
    spec = TensorSpec("float32", (4, 4), (1, 4), 3)
    assert np.array_equal(example_input(spec, seed=5), example_input(spec, seed=5))
    assert not np.array_equal(example_input(spec, seed=5), example_input(spec, seed=6))
    a, b = example_inputs([spec, spec], seed=5)
    assert np.array_equal(a, example_input(spec, seed=5))
    assert np.array_equal(b, example_input(spec, seed=6))
    assert not np.array_equal(a, b)


def test_large_float_inputs_are_drawn_in_parts_alike_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """From PARALLEL_DRAW_FROM values on, floats are drawn in a fixed number of parts, each its own stream, on
    threads: the values do not depend on the core count, the parts do not repeat one another, and the seed
    still decides them."""
    from tuneforge.tune import specs

    monkeypatch.setattr(specs, "PARALLEL_DRAW_FROM", 1000)
    spec = TensorSpec.contiguous((4000,), "float32")
    drawn = example_input(spec, seed=7)
    monkeypatch.setattr(specs, "usable_cores", lambda: 1)
    assert np.array_equal(drawn, example_input(spec, seed=7))  # one thread: the same values
    assert not np.array_equal(drawn, example_input(spec, seed=8))
    parts = drawn.reshape(specs.PARTS, -1)
    assert len({part.tobytes() for part in parts}) == specs.PARTS  # no two parts alike
    assert len(np.unique(drawn)) > 3900 and 0.8 < float(drawn.std()) < 1.2
    wide = example_input(TensorSpec.contiguous((4000,), "float64"), seed=7)
    assert wide.dtype == np.float64 and np.array_equal(wide, drawn.astype(np.float64))


def test_global_rng_state_unchanged() -> None:
    np.random.seed(1234)
    random.seed(99)
    before, py_before = np.random.get_state(), random.getstate()

    def uses_global_rng(spec: TensorSpec, rng: np.random.Generator) -> Any:
        random.random()
        return np.random.rand(*spec.sizes)

    example_inputs([TensorSpec.contiguous((3, 3)), TensorSpec("float64", (3, 3), (1, 3), 2)],
                   generators={1: uses_global_rng})
    assert _same_np_state(before, np.random.get_state())
    assert random.getstate() == py_before
    # and the global generator continues where it was
    expected = np.random.RandomState()
    expected.set_state(before)
    assert np.random.rand() == expected.rand()


def test_preserve_rng_state_restores_on_exception() -> None:
    before = np.random.get_state()
    with pytest.raises(RuntimeError), preserve_rng_state():
        np.random.rand(10)
        raise RuntimeError("boom")
    assert _same_np_state(before, np.random.get_state())


def test_generator_output_used_and_copied_into_layout() -> None:
    spec = TensorSpec("int64", (3, 4), (1, 3), 2)

    def indices(s: TensorSpec, rng: np.random.Generator) -> Any:
        assert s == spec
        return np.arange(12).reshape(3, 4)  # C-contiguous: differs from the spec's layout

    value = example_input(spec, generator=indices)
    assert TensorSpec.of(value) == spec
    assert np.array_equal(value, np.arange(12).reshape(3, 4))


def test_generator_output_in_spec_layout_is_returned_as_is() -> None:
    spec = TensorSpec.contiguous((5,), "int32")
    made = np.array([4, 3, 2, 1, 0], dtype=np.int32)
    assert example_input(spec, generator=lambda s, rng: made) is made


def test_generator_uses_the_seeded_rng() -> None:
    spec = TensorSpec.contiguous((6,), "int64")

    def draw(s: TensorSpec, rng: np.random.Generator) -> Any:
        return rng.integers(0, 1000, s.sizes)

    assert np.array_equal(example_input(spec, seed=1, generator=draw), example_input(spec, seed=1, generator=draw))
    assert not np.array_equal(example_input(spec, seed=1, generator=draw),
                              example_input(spec, seed=2, generator=draw))


def test_generator_wrong_shape_names_the_argument() -> None:
    specs = [TensorSpec.contiguous((2,)), TensorSpec.contiguous((4, 4))]
    with pytest.raises(ValueError, match=r"argument 1 returned shape \(4,\).*sizes \(4, 4\)"):
        example_inputs(specs, generators={1: lambda s, rng: np.zeros(4)})
    with pytest.raises(ValueError, match="cannot be cast"):
        example_inputs([TensorSpec.contiguous((2,), "int32")], generators={0: lambda s, rng: np.zeros(2)})
    with pytest.raises(ValueError, match="only 2 specs"):
        example_inputs(specs, generators={2: lambda s, rng: np.zeros(4)})


# ---------------------------------------------------------------- torch (skipped when torch is absent)

def test_torch_of_and_key() -> None:
    torch = pytest.importorskip("torch")
    base = torch.zeros(10, 10, dtype=torch.bfloat16)
    spec = TensorSpec.of(base[1:, 2:].t())
    assert spec == TensorSpec("bfloat16", (8, 9), (1, 10), 12, "cpu", None, "torch")
    assert TensorSpec.of(torch.zeros(2, dtype=torch.float32)).dtype == "float32"


@pytest.mark.parametrize("spec", [
    TensorSpec("float32", (3, 4), (1, 3), 5, framework="torch"),
    TensorSpec("bfloat16", (4, 3), (0, 1), 2),
    TensorSpec("int64", (7,), (2,), 3, framework="torch"),
    TensorSpec("bool", (3, 3), (3, 1), 1, framework="torch"),
    TensorSpec("float32", (0, 3), (3, 1), 4, framework="torch"),
], ids=lambda s: s.describe())
def test_torch_example_input_layout(spec: TensorSpec) -> None:
    torch = pytest.importorskip("torch")
    value = example_input(spec, seed=2)
    assert isinstance(value, torch.Tensor)
    assert TensorSpec.of(value) == spec
    assert value.untyped_storage().nbytes() >= spec.storage_size * spec.itemsize
    assert torch.equal(value, example_input(spec, seed=2))


def test_torch_rng_state_unchanged() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(7)
    before = torch.random.get_rng_state()

    def uses_global(s: TensorSpec, rng: np.random.Generator) -> Any:
        return torch.rand(s.sizes)

    spec = TensorSpec("float32", (3, 4), (1, 3), 5, framework="torch")
    example_inputs([spec, spec], generators={1: uses_global})
    assert torch.equal(before, torch.random.get_rng_state())


def test_torch_generator_copied_into_layout() -> None:
    torch = pytest.importorskip("torch")
    spec = TensorSpec("int64", (3, 4), (1, 3), 2, framework="torch")
    value = example_input(spec, generator=lambda s, rng: torch.arange(12).reshape(3, 4))
    assert TensorSpec.of(value) == spec
    assert torch.equal(value, torch.arange(12).reshape(3, 4))
    with pytest.raises(ValueError, match="argument 0"):
        example_inputs([spec], generators={0: lambda s, rng: torch.zeros(5)})
