"""The member's own notebooks as context: attached and pinned, read by index range, their
kernel inspected with consent by a fixed probe, and edited only through reviewed proposals.

``document`` is pure (parse, summarise, fingerprint, render); ``probe`` is the server-authored
kernel probe; ``service`` reaches the Jupyter server's contents, session and kernel managers;
``store`` keeps consents and proposals. See docs/notebook.md.
"""

from kaizen_server_extension.notebooks.document import (
    NOTEBOOK_MEDIA_TYPE,
    NotebookCell,
    NotebookDocument,
    NotebookFormatError,
)

__all__ = ["NOTEBOOK_MEDIA_TYPE", "NotebookCell", "NotebookDocument", "NotebookFormatError"]
