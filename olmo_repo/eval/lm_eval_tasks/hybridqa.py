"""The `repo_hybridqa` prompt: the table as text (title, header, rows), the passages its cells link to, the
question. Fields are those of the Hub data set `wenhu/hybrid_qa` (cells: {value, urls: [{url, summary}]})."""

from __future__ import annotations


def doc_to_text(doc: dict) -> str:
    table = doc["table"]
    header = list(table["header"])
    cells = list(table["data"])
    rows = (
        cells
        if cells and isinstance(cells[0], list)
        else [cells[i : i + len(header)] for i in range(0, len(cells), len(header))]
    )
    lines = [f"Title: {table['title']}"]
    if table.get("section_title"):
        lines.append(f"Section: {table['section_title']}")
    lines.append(" | ".join(header))
    lines += [" | ".join(cell["value"] for cell in row) for row in rows]
    passages = {}
    for row in rows:
        for cell in row:
            for link in cell.get("urls") or []:
                passages.setdefault(link["url"], f"{cell['value']}: {link['summary']}")
    text = "Table:\n" + "\n".join(lines)
    if passages:
        text += "\n\nPassages:\n" + "\n".join(passages.values())
    return f"{text}\n\nQuestion: {doc['question']}\nAnswer:"
