#!/usr/bin/env bash
# Build the Python API reference from the docstrings with pdoc, into build/api/ (git-ignored).
# Installs pdoc into .venv if it is missing. Fails on any warning pdoc raises and on any
# reST field or role left unrendered in a docstring (a misspelt `:returns:` and the like).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"
PDOC_VERSION="${PDOC_VERSION:-16.0.0}"

if [ ! -x .venv/bin/python ]; then
    "$here/setup-venv.sh"
fi
if ! .venv/bin/python -c 'import pdoc' >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "pdoc==$PDOC_VERSION"
fi
if [ -z "${LEASEHOLD_LIBRARY:-}" ] && [ -f "$repo/target/release/libleasehold.so" ]; then
    export LEASEHOLD_LIBRARY="$repo/target/release/libleasehold.so"
fi

out="$here/build/api"
rm -rf "$out"
.venv/bin/python - "$out" <<'PY'
import pathlib
import re
import sys
import warnings

import pdoc
import pdoc.render

out = pathlib.Path(sys.argv[1])
modules = [
    "leasehold",
    "leasehold.client",
    "leasehold.aio",
    "leasehold.service",
    "leasehold.fencing",
    "leasehold.errors",
    "leasehold.testing",
    "leasehold.cli",
    "leasehold.backends",
    "leasehold.backends.memory",
    "leasehold.backends.sqlite",
    "leasehold.backends.redis",
    "leasehold.backends.redis_async",
    "leasehold.backends.redis_connect",
    "leasehold.backends.redis_executor",
    "leasehold.backends.redis_executor_async",
    "leasehold.backends.redis_stream",
    "leasehold.backends.redis_stream_async",
    "leasehold.backends.sql_executor",
    "leasehold.backends.sql_executor_async",
    "leasehold.backends.etcd_executor",
]
pdoc.render.configure(docformat="restructuredtext", show_source=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pdoc.pdoc(*modules, output_directory=out)
problems = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]

# pdoc renders reST fields (:param:, :return:, :raises:) and roles (:class:, :meth:, ...);
# whatever it did not recognise is left as raw text in the rendered docstring.
raw = re.compile(r":(?:class|mod|meth|func|attr|exc|data|obj|param|type|returns?|rtype|raises?)[:`]")
for page in sorted(out.rglob("*.html")):
    for block in re.findall(r'<div class="docstring">(.*?)</div>', page.read_text(), re.S):
        for m in raw.finditer(block):
            snippet = re.sub(r"<[^>]+>", "", block[m.start() : m.start() + 80]).split("\n")[0]
            problems.append(f"unrendered reST in {page.relative_to(out)}: {snippet}")

pages = list(out.rglob("*.html"))
if len(pages) < len(modules):
    problems.append(f"only {len(pages)} pages for {len(modules)} modules")
for p in problems:
    print("build-docs:", p, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"build-docs: {len(pages)} pages in {out}")
PY
