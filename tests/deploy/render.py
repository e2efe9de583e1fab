#!/usr/bin/env python3
"""Renders deploy/ for the deployment tests, as JSON on stdout. Run with the python of the
virtualenvs tests/deploy/install-validators.sh makes (compose: docker-compose; k8s:
kubernetes-validate).

  render.py compose FILE        the compose file as `docker-compose config` resolves it
  render.py kustomize DIR       the resources of a kustomization, with its patches applied
  render.py validate VERSION DIR...  renders each DIR and validates every resource against
                                the Kubernetes schemas of VERSION (kubernetes-validate)

The kustomize part implements only what deploy/kubernetes uses: `resources` (files and
kustomization folders), `namespace`, and `patches` by path as strategic merges (maps merge,
lists of named items merge by name, other lists are replaced). A file using anything else
is refused, so the render never silently differs from kustomize's.
"""
import json
import os
import subprocess
import sys

import yaml

KNOWN_KEYS = {"apiVersion", "kind", "namespace", "resources", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition"}


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def merge(base, patch):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    if (isinstance(base, list) and isinstance(patch, list) and patch
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = list(base)
        for item in patch:
            for i, existing in enumerate(out):
                if existing["name"] == item["name"]:
                    out[i] = merge(existing, item)
                    break
            else:
                out.append(item)
        return out
    return patch


def kustomize(directory):
    k = load_docs(os.path.join(directory, "kustomization.yaml"))[0]
    unknown = set(k) - KNOWN_KEYS
    if unknown:
        sys.exit(f"{directory}: kustomization keys this renderer does not implement: {sorted(unknown)}")
    resources = []
    for r in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, r))
        if os.path.isdir(path):
            resources.extend(kustomize(path))
        else:
            resources.extend(load_docs(path))
    for p in k.get("patches", []):
        if set(p) != {"path"}:
            sys.exit(f"{directory}: only `patches: - path:` is implemented")
        for patch in load_docs(os.path.join(directory, p["path"])):
            key = (patch["kind"], patch["metadata"]["name"])
            targets = [i for i, r in enumerate(resources)
                       if (r["kind"], r["metadata"]["name"]) == key]
            if len(targets) != 1:
                sys.exit(f"{directory}: patch {key} matches {len(targets)} resources")
            resources[targets[0]] = merge(resources[targets[0]], patch)
    if "namespace" in k:
        for r in resources:
            if r["kind"] not in CLUSTER_SCOPED:
                r.setdefault("metadata", {})["namespace"] = k["namespace"]
    return resources


def main():
    cmd = sys.argv[1]
    if cmd == "compose":
        # The docker-compose of this interpreter's virtualenv (install-validators.sh).
        compose = os.path.join(os.path.dirname(sys.executable), "docker-compose")
        out = subprocess.run([compose, "-f", sys.argv[2], "--profile", "bench", "config"],
                             check=True, capture_output=True, text=True).stdout
        resolved = yaml.safe_load(out)
        # docker-compose 1.29 prints volumes in the short syntax: make them long-syntax
        # objects, as the Compose Specification's own resolver prints them.
        for service in resolved["services"].values():
            long = []
            for v in service.get("volumes", []):
                if isinstance(v, str):
                    parts = v.split(":")
                    source, target = parts[0], parts[1]
                    long.append({"type": "bind" if source.startswith("/") else "volume",
                                 "source": source, "target": target,
                                 "read_only": len(parts) > 2 and "ro" in parts[2].split(",")})
                else:
                    long.append(v)
            service["volumes"] = long
        print(json.dumps(resolved))
    elif cmd == "kustomize":
        print(json.dumps(kustomize(sys.argv[2])))
    elif cmd == "validate":
        import kubernetes_validate
        version = sys.argv[2]
        report = []
        for directory in sys.argv[3:]:
            for r in kustomize(directory):
                name = f"{directory}: {r['kind']}/{r['metadata']['name']}"
                try:
                    kubernetes_validate.validate(r, version, strict=True)
                    report.append({"resource": name, "outcome": "valid"})
                except kubernetes_validate.SchemaNotFoundError as e:
                    # Custom resources (ServiceMonitor, Certificate): no schema bundled.
                    report.append({"resource": name, "outcome": "no schema", "detail": str(e)})
                except kubernetes_validate.ValidationError as e:
                    report.append({"resource": name, "outcome": "invalid",
                                   "detail": f"{'.'.join(str(p) for p in e.path)}: {e.message}"})
        print(json.dumps(report))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
