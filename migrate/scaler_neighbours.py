"""No file using a scaler is passed over in silence beside a refused file of its program.

A file may use a scaler (build one, call ``scaler.scale``, define a loss-scaler wrapper class)
and come out of the project analysis unchanged without any diagnostic, while a file it imports,
or that imports it, is refused: the refusal stopped the analysis that would have migrated it
(a wrapper class whose construction was refused, a trainer building its own GradScaler that
a refused setup hands ``None``). Reporting "unchanged" for it reads as "nothing to do". Such a
file is named (RPM110) with the blocker of its neighbour: the neighbour's own refusal where it
has one, else the consistency refusal it received.

Pure source analysis: never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Set, Tuple

from .diagnostics import Diagnostic, FileResult
from .prefilter import might_use_a_scaler

if TYPE_CHECKING:
    from .project import ProjectFile

__all__ = ["name_silent_scaler_users"]

#: the code a file left unchanged for another file's refusal is given
_CONSISTENCY = "RPM110"


def name_silent_scaler_users(files: Mapping[str, "ProjectFile"], results: Dict[str, FileResult]) -> None:
    """Give each unchanged, unreported file that may use a scaler and imports or is imported
    by a refused given file an RPM110 naming that file's blocker, in place. Changes no file."""
    neighbours = _neighbours(files)
    for path in sorted(files):
        result = results[path]
        if files[path].tree is None or result.changed or result.diagnostics:
            continue
        if not might_use_a_scaler(files[path].source):
            continue
        found = _blocker(sorted(neighbours.get(path, ())), results)
        if found is None:
            continue
        (blocking_path, blocker), line = found, _import_line(files[path], found[0])
        result.diagnostics.append(
            Diagnostic(
                path,
                line,
                1,
                _CONSISTENCY,
                (
                    f"left unchanged because {blocking_path}:{blocker.line} ({blocker.code}) is not "
                    "migrated and this file takes part in the same training program"
                ),
            )
        )


def _neighbours(files: Mapping[str, "ProjectFile"]) -> Dict[str, Set[str]]:
    """Path -> the given files it imports or that import it."""
    found: Dict[str, Set[str]] = {}
    for path, project_file in files.items():
        for edge in project_file.imports:
            found.setdefault(path, set()).add(edge.target)
            found.setdefault(edge.target, set()).add(path)
    return found


def _blocker(paths: List[str], results: Mapping[str, FileResult]) -> Optional[Tuple[str, Diagnostic]]:
    """The first refusal of ``paths`` that is a file's own (not RPM110), else the first
    RPM110; None when none of them is refused."""
    refusals = [(p, d) for p in paths for d in results[p].diagnostics if not d.is_info]
    own = [(p, d) for p, d in refusals if d.code != _CONSISTENCY]
    ranked = own or refusals
    return ranked[0] if ranked else None


def _import_line(project_file: "ProjectFile", other: str) -> int:
    """The line where the file imports ``other``; 1 where ``other`` imports it."""
    return min((e.line for e in project_file.imports if e.target == other), default=1)
