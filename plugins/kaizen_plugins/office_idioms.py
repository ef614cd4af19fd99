"""The native-office paragraph of run_code's description (R-177, R-246).

create_artifact writes text kinds only and refuses .docx/.pptx/.xlsx titles with a redirect
to run_code; this paragraph is the other half of that steer: short, working idioms for the
document writers the sandbox has. tests/kernel/test_office_idioms.py extracts every idiom
from this exact text and runs it against the pinned real libraries, so the advice cannot rot.

Each idiom is ``<library> (<file>):`` followed by a fenced python block that writes ``<file>``
into the working directory.
"""

from __future__ import annotations

import re

OFFICE_IDIOMS = '''\
Native files (PDF, Word, PowerPoint, Excel, charts): write them with run_code, not \
create_artifact or the staged writer (those take text kinds only). Save into the working \
directory and name each file in artifact_targets; it is kept as a downloadable artifact.
python-pptx (deck.pptx):
```python
from pptx import Presentation
deck = Presentation()
slide = deck.slides.add_slide(deck.slide_layouts[1])
slide.shapes.title.text = "Quarterly review"
slide.placeholders[1].text = "Revenue up 12%"
deck.save("deck.pptx")
```
ReportLab (report.pdf):
```python
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas
pdf = canvas.Canvas("report.pdf", pagesize=A4)
pdf.drawString(72, 770, "Quarterly review")
pdf.save()
```
python-docx (memo.docx):
```python
from docx import Document
doc = Document()
doc.add_heading("Quarterly review", level=1)
doc.add_paragraph("Revenue up 12%.")
doc.save("memo.docx")
```
openpyxl (figures.xlsx):
```python
from openpyxl import Workbook
book = Workbook()
sheet = book.active
sheet.append(["quarter", "revenue"])
sheet.append(["Q1", 120])
book.save("figures.xlsx")
```
Matplotlib (chart.png):
```python
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.bar(["Q1", "Q2"], [120, 134])
fig.savefig("chart.png")
```'''

_IDIOM = re.compile(r"^(?P<library>[\w.-]+) \((?P<target>[\w.-]+)\):\n```python\n"
                    r"(?P<code>.*?)```", re.MULTILINE | re.DOTALL)


def idioms(description: str) -> dict[str, tuple[str, str]]:
    """``{library: (target file, code)}`` for every idiom written in ``description``."""
    return {m["library"]: (m["target"], m["code"]) for m in _IDIOM.finditer(description)}
