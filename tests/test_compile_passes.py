"""compile_passes.explain_flat_inputs."""

import torch
from subclasses import Mesh, MeshTensor, nested

from compile_passes import explain_flat_inputs


def test_report_rows_and_sharing():
    m = Mesh("shared")
    w = MeshTensor(torch.ones(2), m)
    x = nested(2)
    x._mesh = m
    report = explain_flat_inputs([w, x, 3], names=["w", "x", "n"])
    assert [(i.index, i.kind, i.path) for i in report.inputs] == [
        (0, "tensor", "w._data"),
        (1, "opaque", "w._mesh"),
        (2, "tensor", "x._data._data"),
        (3, "opaque", "x._data._mesh"),
        (4, "opaque", "x._mesh"),
        (5, "value", "n"),
    ]
    assert report.inputs[1].shares_with == (4,) and report.inputs[4].shares_with == (1,)
    assert report.inputs[3].shares_with == ()
    assert report.inputs[1].type_name == "subclasses.Mesh"
    assert report.inputs[5].type_name == "int"
    assert len(report.opaques) == 3
    text = str(report)
    assert "w._mesh" in text and "shared with 4" in text
    assert "identity guard: slots 1, 4 must keep holding one object each" in text


def test_default_names():
    report = explain_flat_inputs([MeshTensor(torch.ones(2), Mesh())])
    assert [i.path for i in report.inputs] == ["args[0]._data", "args[0]._mesh"]
