"""Line mutations for the codemod's fuzz tests (single files and projects)."""

MUTATIONS = ["drop", "dup", "swap", "dedent"]


def mutate_lines(lines, ops):
    """Apply ``(operation, index)`` pairs to a list of source lines; the index wraps."""
    lines = list(lines)
    for op, i in ops:
        if not lines:
            break
        i %= len(lines)
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap" and i + 1 < len(lines):
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
        elif op == "dedent":
            lines[i] = lines[i][4:] if lines[i].startswith("    ") else lines[i]
    return "".join(lines)
