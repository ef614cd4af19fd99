/**
 * The message box. Enter sends and Shift+Enter is a new line (or, with the "Mod+Enter"
 * setting, Ctrl/Cmd+Enter sends and Enter is a new line). While the room is busy a message
 * queues; "Steer" sends the text as steering for the run in progress instead.
 */
import React, { useRef, useState } from 'react';

import { isSendKey } from '../keys';

export interface IComposerProps {
  busy: boolean;
  sending: boolean;
  disabled: boolean;
  sendKey: 'Enter' | 'Mod+Enter';
  onSend: (text: string, kind: 'message' | 'steering') => Promise<boolean>;
}

export function Composer(props: IComposerProps): JSX.Element {
  const { busy, sending, disabled, sendKey, onSend } = props;
  const [text, setText] = useState('');
  const area = useRef<HTMLTextAreaElement>(null);

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
        onChange={event => setText(event.target.value)}
        onKeyDown={event => {
          if (isSendKey(event.nativeEvent, sendKey)) {
            event.preventDefault();
            event.stopPropagation();
            submit('message');
          }
        }}
      />
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
