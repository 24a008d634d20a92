"""Validates ServiceMonitor and PrometheusRule objects against the vendored schemas.

Usage: validate.py < manifests.json  (a JSON array of Kubernetes objects, as yaml2json
prints). Objects of other kinds are ignored. Prints one line per object checked, and every
violation with its path; exits 1 when any object is invalid or none was checked.
"""
import json
import pathlib
import sys

import jsonschema

HERE = pathlib.Path(__file__).parent
SCHEMAS = {
    "ServiceMonitor": "servicemonitor.schema.json",
    "PrometheusRule": "prometheusrule.schema.json",
}


def closed(schema):
    """Every object schema with properties rejects unknown fields (strict field validation)."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema and schema["properties"]:
            schema["additionalProperties"] = False
        for value in schema.values():
            closed(value)
    elif isinstance(schema, list):
        for value in schema:
            closed(value)
    return schema


def main():
    docs = json.load(sys.stdin)
    checked = 0
    bad = 0
    for doc in docs:
        kind = doc.get("kind")
        if kind not in SCHEMAS or doc.get("apiVersion") != "monitoring.coreos.com/v1":
            continue
        schema = closed(json.loads((HERE / SCHEMAS[kind]).read_text()))
        validator = jsonschema.Draft7Validator(schema)
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        name = doc.get("metadata", {}).get("name")
        checked += 1
        if errors:
            bad += 1
            print(f"INVALID {kind} {name}:")
            for error in errors:
                path = "/".join(str(p) for p in error.absolute_path)
                print(f"  at /{path}: {error.message}")
        else:
            print(f"valid {kind} {name}")
    if checked == 0:
        print("no ServiceMonitor or PrometheusRule in the input")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
