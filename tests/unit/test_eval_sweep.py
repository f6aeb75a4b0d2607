"""scripts.eval_sweep's variant syntax (label=mode,fusion,rrf_k,dense_weight,sparse_weight,candidates) and
make eval's choice of configurations."""

from __future__ import annotations

import pytest

from ragrpc.v1 import retrieve_pb2
from scripts.eval_sweep import TOP_K, Variant


def test_a_full_variant_sets_every_option() -> None:
    variant = Variant.parse("weighted 0.6=hybrid,weighted,,0.6,0.4,100")
    options = variant.options
    assert variant.label == "weighted 0.6"
    assert options.mode == retrieve_pb2.RETRIEVAL_MODE_HYBRID
    assert options.fusion == retrieve_pb2.FUSION_METHOD_WEIGHTED
    assert options.rrf_k == 0 and options.candidates == 100 and options.top_k == TOP_K
    assert options.dense_weight == 0.6 and options.sparse_weight == 0.4


def test_empty_fields_leave_the_server_defaults() -> None:
    options = Variant.parse("defaults=").options
    assert options.mode == retrieve_pb2.RETRIEVAL_MODE_HYBRID
    assert options.fusion == retrieve_pb2.FUSION_METHOD_UNSPECIFIED and options.rrf_k == 0
    assert not options.HasField("dense_weight") and not options.HasField("sparse_weight")
    assert options.candidates == 200  # what make eval asks for
    assert Variant.parse("rrf 20=hybrid,rrf,20").options.rrf_k == 20


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(KeyError):
        Variant.parse("x=semantic")


def test_make_eval_refuses_an_unknown_configuration_before_ingesting(capsys: pytest.CaptureFixture[str]) -> None:
    from scripts import eval as make_eval

    with pytest.raises(SystemExit) as exited:
        make_eval.main(["/nonexistent:test", "--config", "sparse bm25s"])
    assert exited.value.code == 2
    assert "unknown configuration(s) ['sparse bm25s']" in capsys.readouterr().err
    names = {c.name for c in make_eval.configs(include_milvus_bm25=True)}
    assert {"sparse milvus_bm25", "hybrid rrf (milvus_bm25)", "hybrid rrf"} <= names
