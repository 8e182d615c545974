"""The job's Python types against the schema the Rust types emit
(``zflow_torch/job.schema.json``, kept current by ``runtime/src/contract/schema.rs``), and the
decoder's refusals."""

import dataclasses
import json
import types
import typing
import unittest
from pathlib import Path
from typing import Any, Literal

from test_checkpoint import TINY_JSON

from zflow_torch import job
from zflow_torch.job import DecodeError, ModelConfig, TrainJob, decode, encode

SCHEMA = json.loads((Path(job.__file__).parent / "job.schema.json").read_text())


def _json_type(hint: object) -> dict[str, Any]:
    """What the schema should say of a field of Python type ``hint``."""
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return {"type": [_json_type(inner)["type"], "null"]}
    if origin is Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin is list:
        return {"type": "array", "items": _json_type(typing.get_args(hint)[0])}
    names: dict[object, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return {"type": names[hint]}


def _schema_type(prop: dict[str, Any]) -> dict[str, Any]:
    """The same view of a schema property (an enum resolved from its definition)."""
    if "$ref" in prop:
        target = SCHEMA["$defs"][prop["$ref"].rsplit("/", 1)[1]]
        if "oneOf" in target or "enum" in target:
            consts = [o["const"] for o in target["oneOf"]] if "oneOf" in target else target["enum"]
            return {"enum": consts}
        return {"$ref": prop["$ref"]}
    out: dict[str, Any] = {"type": prop["type"]}
    if "items" in prop:
        out["items"] = _schema_type(prop["items"])
    return out


class JobTypes(unittest.TestCase):
    def test_every_dataclass_has_the_schemas_fields_and_types_in_order(self) -> None:
        definitions = {"TrainJob": SCHEMA, **SCHEMA["$defs"]}
        checked = set()
        for name, definition in definitions.items():
            if "properties" not in definition:
                continue
            cls = getattr(job, name)
            hints = typing.get_type_hints(cls)
            fields = [f.name for f in dataclasses.fields(cls)]
            self.assertEqual(fields, list(definition["properties"]), name)
            for field, prop in definition["properties"].items():
                self.assertEqual(_json_type(hints[field]), _schema_type(prop), f"{name}.{field}")
            checked.add(name)
        self.assertIn("TrainSettings", checked)
        self.assertIn("ModelConfig", checked)

    def test_decode_names_the_bad_field_and_round_trips(self) -> None:
        model = TINY_JSON
        m = decode(ModelConfig, model)
        self.assertEqual(encode(m), model)
        # In the Rust field order, which the checkpoints' model.json keeps.
        self.assertEqual(list(encode(m)), list(SCHEMA["$defs"]["ModelConfig"]["properties"]))
        with self.assertRaisesRegex(DecodeError, r"ModelConfig\.hidden_size: expected an integer"):
            decode(ModelConfig, {**model, "hidden_size": "32"})
        with self.assertRaisesRegex(DecodeError, r"ModelConfig\.skip_output: expected one of"):
            decode(ModelConfig, {**model, "skip_output": "input_scaled"})
        with self.assertRaisesRegex(DecodeError, "unknown field `hiden_size`"):
            decode(ModelConfig, {**model, "hiden_size": 1})
        without = dict(model)
        del without["eda"]
        with self.assertRaisesRegex(DecodeError, "missing field `eda`"):
            decode(ModelConfig, without)
        with self.assertRaisesRegex(DecodeError, r"TrainJob: expected an object"):
            decode(TrainJob, [])


if __name__ == "__main__":
    unittest.main()
