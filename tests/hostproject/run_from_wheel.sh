#!/usr/bin/env bash
# The packaging proof: build the wheel and sdist, check what the wheel ships,
# install it into a fresh virtual environment with only the host project's test
# dependencies, and run the host project's tests there, from a copy of the host
# project outside the source tree (so `import approvals` is the installed one).
#
#   tests/hostproject/run_from_wheel.sh <python> <venv-dir>
#
# <venv-dir> is deleted and created afresh. Exits non-zero on any failure,
# including a test run that collected no tests.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 <python> <venv-dir>" >&2
  exit 2
fi
PYTHON=$1
VENV=$2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
started=$(date +%s)
step() { echo "--- $* ($(( $(date +%s) - started ))s)"; }
# pip's notes about this machine's optional local indexes are noise here.
pipq() { "$@" --quiet --disable-pip-version-check 2> >(grep -v '^WARNING: Location' >&2); }

# `python -m build` makes the sdist first and the wheel from it, so a file the sdist
# forgets fails here too.
step "build wheel and sdist with $("$PYTHON" --version)"
"$PYTHON" -m venv "$WORK/build-env"
pipq "$WORK/build-env/bin/python" -m pip install "build>=1.2" "hatchling>=1.25"
"$WORK/build-env/bin/python" -m build --no-isolation --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { cat "$WORK/build.log" >&2; echo "build failed" >&2; exit 1; }
WHEEL=$(ls "$WORK"/dist/*.whl)
SDIST=$(ls "$WORK"/dist/*.tar.gz)
echo "built $(basename "$WHEEL") and $(basename "$SDIST")"

step "check the wheel's and the sdist's contents"
"$PYTHON" - "$WHEEL" "$SDIST" <<'PY'
import sys
import tarfile
import zipfile

wheel, sdist = sys.argv[1], sys.argv[2]
names = zipfile.ZipFile(wheel).namelist()
problems = []
required = {
    "py.typed": lambda n: n == "approvals/py.typed",
    "migrations": lambda n: n == "approvals/migrations/0001_initial.py",
    "templates": lambda n: n.startswith("approvals/templates/") and n.endswith(".html"),
    "static JavaScript": lambda n: n.startswith("approvals/static/") and n.endswith(".js"),
    "static CSS": lambda n: n.startswith("approvals/static/") and n.endswith(".css"),
    "OpenAPI document": lambda n: n == "approvals/openapi.json",
    "admin confirmation template": lambda n: n.startswith("approvals/templates/admin/"),
    "sweep command": lambda n: n.endswith("management/commands/approvals_sweep.py"),
}
for what, test in required.items():
    if not any(test(n) for n in names):
        problems.append(f"wheel lacks {what}")
for n in names:
    top = n.split("/", 1)[0]
    if not (top == "approvals" or top.endswith(".dist-info")):
        problems.append(f"wheel ships {n}")
    if n.endswith((".pyc", ".sqlite3")) or "__pycache__" in n:
        problems.append(f"wheel ships {n}")
members = [m.split("/", 1)[1] for m in tarfile.open(sdist).getnames() if "/" in m]
top_level = {"approvals", "README.md", "pyproject.toml", "PKG-INFO", ".gitignore", "LICENSE"}
for m in members:
    if m.split("/", 1)[0] not in top_level:
        problems.append(f"sdist ships {m}")
for needed in ("pyproject.toml", "approvals/__init__.py", "approvals/py.typed"):
    if needed not in members:
        problems.append(f"sdist lacks {needed}")
if problems:
    sys.exit("packaging problems:\n  " + "\n  ".join(problems))
print(f"wheel: {len(names)} files, all under approvals/; sdist: {len(members)} entries")
PY

step "fresh virtual environment $VENV: the wheel and the host project's test dependencies"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pipq "$VENV/bin/python" -m pip install "$WHEEL" -r "$HERE/requirements.txt"
"$VENV/bin/python" -c 'import django, channels, daphne; print(f"Django {django.get_version()}, channels {channels.__version__}, daphne {daphne.__version__}")'

step "host project tests from a copy outside the source tree"
mkdir "$WORK/host"
(cd "$HERE" && tar --exclude=__pycache__ --exclude='*.sqlite3' --exclude=run_from_wheel.sh -cf - .) \
  | tar -xf - -C "$WORK/host"
set +e
(
  cd "$WORK/host"
  env -u PYTHONPATH -u DJANGO_SETTINGS_MODULE HOSTPROJECT_FROM_WHEEL=1 \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider 2>&1 | tee "$WORK/pytest.log"
  exit "${PIPESTATUS[0]}"
)
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "run_from_wheel: pytest collected no tests" >&2
  exit 1
fi
if [ $rc -ne 0 ]; then
  echo "run_from_wheel: host project tests failed (pytest exit $rc)" >&2
  exit "$rc"
fi
if grep -Eq '[0-9]+ skipped' "$WORK/pytest.log"; then
  echo "run_from_wheel: tests were skipped; from the wheel every host test must run" >&2
  exit 1
fi
step "done"
