/**
 * "Allow for this conversation": the tools the member allowed in one conversation (approved
 * with `scope: 'conversation'`), listed and revocable. A grant answers only the member's own
 * approval card for that tool there; the server still applies every guardrail and permission.
 */
import { KaizenApi, Result } from './api';
import { Observable } from './model';
import { isRecord } from './protocol';

export interface IToolGrant {
  tool: string;
  grantedAt: string;
}

export function parseGrants(body: unknown): IToolGrant[] | null {
  if (!Array.isArray(body)) {
    return null;
  }
  return body
    .filter(isRecord)
    .filter(g => typeof g.tool === 'string')
    .map(g => ({ tool: g.tool as string, grantedAt: String(g.granted_at ?? '') }));
}

type GrantsApi = Pick<KaizenApi, 'call'>;

export interface IGrantsState {
  grants: IToolGrant[];
  /** A member-safe sentence from the last failed action, or null. */
  message: string | null;
}

export class GrantsModel extends Observable<IGrantsState> {
  constructor(
    private readonly _api: GrantsApi,
    readonly conversationId: string
  ) {
    super({ grants: [], message: null });
  }

  private get _base(): string {
    return `conversations/${encodeURIComponent(this.conversationId)}/tool-grants`;
  }

  async refresh(): Promise<void> {
    const result: Result<IToolGrant[]> = await this._api.call(
      'GET',
      this._base,
      undefined,
      "list this conversation's allowed tools",
      parseGrants
    );
    this.set(
      result.ok
        ? { grants: result.value, message: null }
        : { ...this._value, message: result.message }
    );
  }

  /** Revoke one grant: the tool's next call here asks again. */
  async revoke(tool: string): Promise<void> {
    const result = await this._api.call(
      'DELETE',
      `${this._base}/${encodeURIComponent(tool)}`,
      undefined,
      `stop allowing ${tool}`,
      body => body
    );
    if (!result.ok && result.status !== 404) {
      this.set({ ...this._value, message: result.message });
      return;
    }
    await this.refresh();
  }

  dismiss(): void {
    this.set({ ...this._value, message: null });
  }
}
