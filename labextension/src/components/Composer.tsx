/**
 * The message box. Enter sends and Shift+Enter is a new line (or, with the "Mod+Enter"
 * setting, Ctrl/Cmd+Enter sends and Enter is a new line). While the room is busy a message
 * queues; "Steer" sends the text as steering for the run in progress instead. Jupyter files
 * attached to the next message show as chips; `@path` names one too, with completion.
 */
import React, { useRef, useState } from 'react';

import { IAttachment } from '../jupyterFiles';
import { isSendKey } from '../keys';
import { AttachmentChips, FolderLister, PathOptions, usePathCompletion } from './AttachmentChips';

export interface IComposerProps {
  busy: boolean;
  sending: boolean;
  disabled: boolean;
  sendKey: 'Enter' | 'Mod+Enter';
  onSend: (text: string, kind: 'message' | 'steering') => Promise<boolean>;
  /** Jupyter files on the next message, and taking one off. */
  attachments?: readonly IAttachment[];
  attaching?: boolean;
  onDetach?: (artifactId: string) => void;
  /** Lists a folder of the Jupyter tree for `@path` completion; without it, no completion. */
  listFolder?: FolderLister;
  /** A file taken from the completion list: attach it now. */
  onAttach?: (path: string) => void;
}

export function Composer(props: IComposerProps): JSX.Element {
  const { busy, sending, disabled, sendKey, onSend } = props;
  const [text, setText] = useState('');
  const area = useRef<HTMLTextAreaElement>(null);
  const completion = usePathCompletion(text, area, setText, props.listFolder, props.onAttach);

  const submit = (kind: 'message' | 'steering'): void => {
    if (!text.trim() || sending || disabled) {
      return;
    }
    const sent = text;
    void onSend(sent, kind).then(ok => {
      // Keep the text on failure: sending again re-uses the idempotency key.
      if (ok) {
        setText(current => (current === sent ? '' : current));
      }
      area.current?.focus();
    });
  };

  const hint =
    sendKey === 'Enter' ? 'Enter to send, Shift+Enter for a new line' : 'Ctrl+Enter to send';
  return (
    <form
      className="jp-Kaizen-composer"
      onSubmit={event => {
        event.preventDefault();
        submit('message');
      }}
    >
      <AttachmentChips
        attachments={props.attachments ?? []}
        attaching={props.attaching ?? false}
        onDetach={id => props.onDetach?.(id)}
      />
      <label className="jp-Kaizen-srOnly" htmlFor="jp-Kaizen-composerText">
        Message
      </label>
      <textarea
        id="jp-Kaizen-composerText"
        ref={area}
        className="jp-Kaizen-textarea"
        rows={3}
        value={text}
        disabled={disabled}
        placeholder={busy ? 'Busy: a message will queue. Steer to redirect the current run.' : 'Message the agent'}
        aria-describedby="jp-Kaizen-composerHint"
        aria-autocomplete={props.listFolder ? 'list' : undefined}
        aria-controls={completion.options.length ? 'jp-Kaizen-pathOptions' : undefined}
        aria-activedescendant={
          completion.options.length ? `jp-Kaizen-pathOptions-${completion.active}` : undefined
        }
        onChange={event => setText(event.target.value)}
        onKeyDown={event => {
          if (completion.onKeyDown(event)) {
            event.stopPropagation();
            return;
          }
          if (isSendKey(event.nativeEvent, sendKey)) {
            event.preventDefault();
            event.stopPropagation();
            submit('message');
          }
        }}
      />
      <PathOptions completion={completion} listId="jp-Kaizen-pathOptions" />
      <div className="jp-Kaizen-composerBar">
        <span id="jp-Kaizen-composerHint" className="jp-Kaizen-hint">
          {hint}
        </span>
        {busy && (
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-Kaizen-secondary"
            disabled={!text.trim() || sending || disabled}
            onClick={() => submit('steering')}
            title="Send as steering for the run in progress"
          >
            Steer
          </button>
        )}
        <button
          type="submit"
          className="jp-Button jp-mod-styled jp-mod-accept"
          disabled={!text.trim() || sending || disabled}
        >
          {busy ? 'Queue' : 'Send'}
        </button>
      </div>
    </form>
  );
}
