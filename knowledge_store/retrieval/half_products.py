"""Dot products of float16 rows with float32 vectors, at the speed of the CPU's conversion instructions.

Sentence vectors are kept in float16 (half the memory of float32, ``sentences.py``).  Scoring a query's pool
means converting a few thousand of them to float32, and NumPy converts float16 one element at a time, which
costs several times the product itself (``bench/half_products.py``).  ONNX Runtime's ``Cast`` converts
with the CPU's vector instructions (F16C, AVX-512), so a two-node graph, ``Cast`` then ``MatMul``, gives the
same float32 products (summed in another order: they agree to float32 rounding) without that cost.

One session per process, built on first use, single-threaded: a query is ranked on one thread, and a second
thread would compete with the query embedding and BM25 for the same cores.
"""

from __future__ import annotations

import threading

import numpy as np

_SESSION = None
_LOCK = threading.Lock()


def _session():
    global _SESSION
    with _LOCK:
        if _SESSION is None:
            import onnxruntime as ort  # noqa: PLC0415 - ONNX Runtime, ~0.2 s to import
            from onnx import TensorProto, helper  # noqa: PLC0415 - onnx, ~0.1 s to import

            graph = helper.make_graph(
                [helper.make_node("Cast", ["rows"], ["rows32"], to=TensorProto.FLOAT),
                 helper.make_node("MatMul", ["rows32", "vectors"], ["products"])],
                "half_products",
                [helper.make_tensor_value_info("rows", TensorProto.FLOAT16, ["n", "dim"]),
                 helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["dim", "k"])],
                [helper.make_tensor_value_info("products", TensorProto.FLOAT, ["n", "k"])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 8  # the newest IR every supported ONNX Runtime reads
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            _SESSION = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return _SESSION


def half_products(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``rows.astype(float32) @ vector`` for float16 ``rows`` (n, dim) and a float32 ``vector`` (dim,): (n,)."""
    rows = np.ascontiguousarray(rows, dtype=np.float16)
    vector = np.asarray(vector, dtype=np.float32)
    if rows.ndim != 2 or vector.shape != (rows.shape[1],):
        raise ValueError(f"half_products: rows {rows.shape} and vector {vector.shape} do not line up")
    if not len(rows):
        return np.zeros(0, dtype=np.float32)
    products = _session().run(None, {"rows": rows, "vectors": np.ascontiguousarray(vector.reshape(-1, 1))})[0]
    return products[:, 0]
