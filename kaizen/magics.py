"""IPython magics: ``%load_ext kaizen``, then

* ``%%kaizen [--conversation ID] [--agent ID] [--new]``: send the cell's text to a
  conversation and stream the answer into the cell's output (rendered as Markdown);
* ``%kaizen_attach NAME [--format csv|parquet] [--max-rows N] [--conversation ID]``: attach
  the variable ``NAME`` (a pandas DataFrame or Series) as a bounded CSV or Parquet file to the
  next ``%%kaizen`` message of that conversation;
* ``%kaizen [--conversation ID]``: show (or set) the server and conversation in use.

Without ``--conversation`` the magics use one conversation per kernel, created on first use
with ``--agent`` (default ``general``). The server is found by ``kaizen.discovery``. Only a
variable's *name* is read from the namespace; nothing is evaluated.
"""

from __future__ import annotations

import io
import re
import time
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import Markdown, display

from kaizen.client import Client, KaizenError
from kaizen.discovery import ServerInfo, find_server

#: Rows of a DataFrame attached at most (the rest is cut, and the message says so).
DEFAULT_MAX_ROWS = 100_000
#: Bytes of one attached file (the server's upload bound).
MAX_ATTACH_BYTES = 25 * 1024 * 1024
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REFRESH_S = 0.1


@magics_class
class KaizenMagics(Magics):
    def __init__(self, shell: Any, server: ServerInfo | None = None) -> None:
        super().__init__(shell)
        self._server = server
        self._client: Client | None = None
        self.conversation_id: str | None = None
        # Attachments waiting for the next %%kaizen of each conversation.
        self.pending: dict[str, list[str]] = {}

    # --- plumbing -----------------------------------------------------------------------

    def client(self) -> Client:
        if self._client is None:
            server = self._server or find_server()
            self._server = server
            self._client = Client(server.url, server.token)
        return self._client

    def _conversation(self, chosen: str | None, agent: str | None, new: bool = False) -> str:
        if chosen:
            return chosen
        if self.conversation_id is None or new:
            title = "From a notebook"
            session = (self.shell.user_ns.get("__session__") if self.shell else None)
            if isinstance(session, str) and session:
                title = f"From {session.rsplit('/', 1)[-1]}"[:300]
            created = self.client().create_conversation(agent or "general", title=title)
            self.conversation_id = created.id
        return self.conversation_id

    # --- %%kaizen -----------------------------------------------------------------------

    @magic_arguments()
    @argument("--conversation", "-c", default=None, help="Conversation id to send to.")
    @argument("--agent", "-a", default=None, help="Agent of a new conversation.")
    @argument("--new", action="store_true", help="Start a new conversation.")
    @cell_magic
    def kaizen(self, line: str, cell: str) -> None:
        """Send the cell to Kaizen and stream the answer here."""
        args = parse_argstring(self.kaizen, line)
        text = cell.strip()
        if not text:
            print("kaizen: the cell is empty; write your question below %%kaizen.")
            return
        try:
            conversation = self._conversation(args.conversation, args.agent, args.new)
            attachments = self.pending.pop(conversation, [])
            handle = display(Markdown("…"), display_id=True)
            streamed: list[str] = []
            shown = [0.0]

            def on_text(piece: str) -> None:
                streamed.append(piece)
                now = time.monotonic()
                if handle is not None and now - shown[0] >= _REFRESH_S:
                    shown[0] = now
                    handle.update(Markdown("".join(streamed)))

            answer = self.client().ask(conversation, text, attachments=attachments,
                                       on_text=on_text)
        except KaizenError as error:
            print(f"kaizen: {error.message} ({error.code})")
            return
        final = answer.text or "".join(streamed)
        if answer.run.status != "completed":
            reason = next((e.data.get("message") for e in reversed(answer.events)
                           if e.type == "run.terminal" and e.data.get("message")), None)
            final += f"\n\n*The run ended {answer.run.status}*" + (f": {reason}" if reason
                                                                    else ".")
        if handle is not None:
            handle.update(Markdown(final or "*No answer.*"))

    # --- %kaizen_attach -----------------------------------------------------------------

    @magic_arguments()
    @argument("name", help="The variable to attach (a pandas DataFrame or Series).")
    @argument("--format", "-f", choices=("csv", "parquet"), default="csv")
    @argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS)
    @argument("--conversation", "-c", default=None)
    @argument("--agent", "-a", default=None)
    @line_magic
    def kaizen_attach(self, line: str) -> None:
        """Attach a DataFrame to the next %%kaizen message, as a bounded CSV/Parquet file."""
        args = parse_argstring(self.kaizen_attach, line)
        namespace = self.shell.user_ns if self.shell is not None else {}
        if not _NAME.fullmatch(args.name) or args.name not in namespace:
            print(f"kaizen: no variable named {args.name!r}.")
            return
        value = namespace[args.name]
        try:
            content, rows, cut = to_file(value, args.format, max(1, args.max_rows))
        except (TypeError, ImportError, ValueError) as exc:
            print(f"kaizen: {exc}")
            return
        if len(content) > MAX_ATTACH_BYTES:
            print(f"kaizen: {args.name} is {len(content)} bytes as {args.format}, more than "
                  f"{MAX_ATTACH_BYTES}; attach fewer rows with --max-rows.")
            return
        media = "text/csv" if args.format == "csv" else "application/vnd.apache.parquet"
        try:
            conversation = self._conversation(args.conversation, args.agent)
            stored = self.client().upload(conversation, f"{args.name}.{args.format}",
                                          content, media)
        except KaizenError as error:
            print(f"kaizen: {error.message} ({error.code})")
            return
        queue = self.pending.setdefault(conversation, [])
        if stored.artifact_id not in queue:
            queue.append(stored.artifact_id)
        note = f" (first {rows} rows; {cut} more left out)" if cut else f" ({rows} rows)"
        print(f"kaizen: {stored.filename}{note}, {len(content):,} bytes, goes with your next "
              "%%kaizen message.")

    # --- %kaizen ------------------------------------------------------------------------

    @magic_arguments()
    @argument("--conversation", "-c", default=None, help="Use this conversation from now on.")
    @line_magic("kaizen")  # type: ignore[arg-type]
    def kaizen_status(self, line: str) -> None:
        args = parse_argstring(self.kaizen_status, line)
        if args.conversation:
            self.conversation_id = args.conversation
        try:
            me = self.client().me()
        except KaizenError as error:
            print(f"kaizen: {error.message} ({error.code})")
            return
        assert self._server is not None
        print(f"kaizen: {self._server.url} as {me.member}; conversation "
              f"{self.conversation_id or '(a new one on first use)'}")


def to_file(value: Any, fmt: str, max_rows: int) -> tuple[bytes, int, int]:
    """``value`` as CSV or Parquet bytes, at most ``max_rows`` rows: (bytes, rows, cut)."""
    kind = type(value)
    module = getattr(kind, "__module__", "")
    if not module.startswith("pandas") or kind.__name__ not in ("DataFrame", "Series"):
        raise TypeError(f"only a pandas DataFrame or Series can be attached, not "
                        f"{kind.__name__}.")
    frame = value.to_frame() if kind.__name__ == "Series" else value
    total = int(frame.shape[0])
    head = frame.head(max_rows)
    if fmt == "csv":
        return head.to_csv(index=False).encode("utf-8"), int(head.shape[0]), total - max_rows \
            if total > max_rows else 0
    buffer = io.BytesIO()
    try:
        head.to_parquet(buffer, index=False)
    except ImportError:
        raise ImportError("Parquet needs pyarrow in this kernel; use --format csv.") from None
    return buffer.getvalue(), int(head.shape[0]), max(0, total - max_rows)
