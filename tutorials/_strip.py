"""Strip outputs and execution counts from notebooks before committing them:

    python tutorials/_strip.py tutorials/*.ipynb

(tests/test_notebooks.py fails on a committed notebook that has outputs.)
"""

import sys

import nbformat


def strip(path: str) -> bool:
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
            cell.outputs, cell.execution_count, changed = [], None, True
        if cell.metadata.pop("execution", None) is not None:
            changed = True
    if changed:
        nbformat.write(nb, path)
    return changed


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(("stripped " if strip(path) else "clean    ") + path)
