"""Running a test's program text as a script, the way a user would run it."""

import contextlib
import io
import pathlib
import runpy


def run_script(source: str, folder: pathlib.Path, name: str) -> str:
    """Write ``source`` to ``folder / name``, run it as ``__main__`` in this process, and
    return what it printed."""
    script = folder / name
    script.write_text(source)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    return out.getvalue()
