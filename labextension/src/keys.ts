/** The composer's send-key rule (pure: unit-tested). */

export type SendKey = 'Enter' | 'Mod+Enter';

export interface IKeyLike {
  key: string;
  shiftKey: boolean;
  ctrlKey: boolean;
  metaKey: boolean;
  altKey: boolean;
  isComposing?: boolean;
}

/**
 * Whether a keydown sends the message. `Enter`: Enter sends, Shift+Enter is a new line.
 * `Mod+Enter`: Ctrl/Cmd+Enter sends, Enter is a new line. Never while an IME composes.
 */
export function isSendKey(
  event: IKeyLike,
  sendKey: SendKey
): boolean {
  if (event.key !== 'Enter' || event.isComposing) {
    return false;
  }
  if (sendKey === 'Mod+Enter') {
    return event.ctrlKey || event.metaKey;
  }
  return !event.shiftKey && !event.ctrlKey && !event.metaKey && !event.altKey;
}

