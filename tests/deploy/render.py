#!/usr/bin/env python3
"""Renders deploy/ for the deployment tests, as JSON on stdout. Run with the python of the
virtualenvs tests/deploy/install-validators.sh makes (compose: docker-compose; k8s:
kubernetes-validate).

  render.py compose FILE        the compose file as `docker-compose config` resolves it
  render.py kustomize DIR       the resources of a kustomization, with its patches applied
  render.py validate VERSION DIR...  renders each DIR and validates every resource against
                                the Kubernetes schemas of VERSION (kubernetes-validate)

The kustomize part is real kustomize: `kubectl kustomize` (the version kubectl bundles: the
pinned kubectl that install-validators.sh puts beside this interpreter), so generators,
name hashes and patches render exactly as `kubectl apply -k` applies them.
"""
import json
import os
import subprocess
import sys

import yaml


def kustomize(directory):
    try:
        kubectl = os.path.join(os.path.dirname(sys.executable), "kubectl")
        out = subprocess.run([kubectl, "kustomize", directory],
                             check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit(f"{kubectl} not found: run tests/deploy/install-validators.sh, which "
                 "installs the pinned kubectl (`kubectl kustomize` renders the manifests)")
    except subprocess.CalledProcessError as e:
        sys.exit(f"kubectl kustomize {directory}: {e.stderr}")
    return [d for d in yaml.safe_load_all(out) if d]


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
