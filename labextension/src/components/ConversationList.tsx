/**
 * The conversation list and the "new chat" form (agent picker, shared or private).
 */
import { refreshIcon } from '@jupyterlab/ui-components';
import React, { useEffect, useState } from 'react';

import { IAgent, IConversation } from '../api';
import { IActivity, Loadable } from '../model';
import { SharedBadge } from './ChatView';

export interface IConversationListProps {
  agents: Loadable<IAgent[]>;
  conversations: Loadable<IConversation[]>;
  /** Busy / pending-approval badges by conversation id. */
  activity?: Readonly<Record<string, IActivity>>;
  defaultAgent: string;
  error: string | null;
  onCreate: (agentId: string, shared: boolean, title: string) => Promise<boolean>;
  onOpen: (id: string) => void;
  onRefresh: () => void;
  onDismissError: () => void;
  /** Opens the member's Kaizen documents (absent: no button). */
  onOpenDocuments?: () => void;
}

export function ConversationList(props: IConversationListProps): JSX.Element {
  const { agents, conversations, defaultAgent, error } = props;
  const agentList = agents.phase === 'ready' ? agents.value : [];
  const names = new Map(agentList.map(a => [a.id, a.name]));
  return (
    <div className="jp-Kaizen-body">
      <div className="jp-Kaizen-header">
        <h2 className="jp-Kaizen-title">Kaizen</h2>
        {props.onOpenDocuments && (
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-Kaizen-secondary jp-Kaizen-openDocuments"
            title="The documents Kaizen can search for you"
            onClick={props.onOpenDocuments}
          >
            Documents
          </button>
        )}
        <button
          type="button"
          className="jp-Kaizen-refresh"
          title="Refresh"
          aria-label="Refresh the agents and conversations"
          disabled={agents.phase === 'loading'}
          onClick={props.onRefresh}
        >
          <refreshIcon.react tag="span" elementSize="normal" />
        </button>
      </div>
      {agents.phase === 'error' ? (
        <p className="jp-Kaizen-error" role="alert">
          {agents.message}
        </p>
      ) : (
        <NewChat
          agents={agentList}
          loading={agents.phase === 'loading'}
          defaultAgent={defaultAgent}
          onCreate={props.onCreate}
        />
      )}
      {error && (
        <div className="jp-Kaizen-error" role="alert">
          <span>{error}</span>
          <button
            type="button"
            className="jp-Kaizen-iconButton"
            aria-label="Dismiss"
            onClick={props.onDismissError}
          >
            ×
          </button>
        </div>
      )}
      <h3 className="jp-Kaizen-subtitle">Conversations</h3>
      {conversations.phase === 'loading' && (
        <p className="jp-Kaizen-status">Loading conversations…</p>
      )}
      {conversations.phase === 'error' && (
        <p className="jp-Kaizen-error" role="alert">
          {conversations.message}
        </p>
      )}
      {conversations.phase === 'ready' &&
        (conversations.value.length === 0 ? (
          <p className="jp-Kaizen-empty">No conversations yet.</p>
        ) : (
          <ul className="jp-Kaizen-conversations" aria-label="Your conversations">
            {conversations.value.map(c => (
              <li key={c.id}>
                <button
                  type="button"
                  className="jp-Kaizen-conversation"
                  data-conversation-id={c.id}
                  onClick={() => props.onOpen(c.id)}
                >
                  <span className="jp-Kaizen-conversationTitle">{c.title}</span>
                  <span className="jp-Kaizen-conversationMeta">
                    <span className="jp-Kaizen-agentName">{names.get(c.agent_id) ?? c.agent_id}</span>
                    <SharedBadge shared={c.shared} />
                    <ActivityBadges activity={props.activity?.[c.id]} />
                  </span>
                </button>
              </li>
            ))}
          </ul>
        ))}
    </div>
  );
}

export function ActivityBadges({ activity }: { activity?: IActivity }): JSX.Element | null {
  if (!activity || (!activity.busy && !activity.approvals)) {
    return null;
  }
  return (
    <>
      {activity.approvals > 0 && (
        <span
          className="jp-Kaizen-badge jp-Kaizen-pendingBadge"
          title="An approval request is waiting for a decision"
        >
          {activity.approvals === 1 ? 'approval pending' : `${activity.approvals} approvals pending`}
        </span>
      )}
      {activity.busy && (
        <span className="jp-Kaizen-badge jp-Kaizen-busyBadge" title="A run is working or queued">
          busy
        </span>
      )}
    </>
  );
}

function NewChat(props: {
  agents: IAgent[];
  loading: boolean;
  defaultAgent: string;
  onCreate: (agentId: string, shared: boolean, title: string) => Promise<boolean>;
}): JSX.Element {
  const { agents, loading, defaultAgent, onCreate } = props;
  const pick = (): string =>
    agents.find(a => a.id === defaultAgent)?.id ?? agents[0]?.id ?? '';
  const [agentId, setAgentId] = useState(pick);
  const [shared, setShared] = useState(false);
  const [title, setTitle] = useState('');
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    if (!agents.some(a => a.id === agentId)) {
      setAgentId(pick());
    }
  }, [agents, defaultAgent]);

  return (
    <form
      className="jp-Kaizen-newChat"
      aria-label="New chat"
      onSubmit={event => {
        event.preventDefault();
        if (!agentId || busy) {
          return;
        }
        setBusy(true);
        void onCreate(agentId, shared, title.trim()).then(ok => {
          setBusy(false);
          if (ok) {
            setTitle('');
          }
        });
      }}
    >
      <label className="jp-Kaizen-field">
        <span>Agent</span>
        <select
          className="jp-mod-styled jp-Kaizen-select"
          value={agentId}
          disabled={loading || !agents.length}
          onChange={event => setAgentId(event.target.value)}
        >
          {agents.map(agent => (
            <option key={agent.id} value={agent.id}>
              {agent.name}
              {agent.mode ? ` (${agent.mode})` : ''}
            </option>
          ))}
        </select>
      </label>
      <label className="jp-Kaizen-field">
        <span>Title</span>
        <input
          className="jp-mod-styled jp-Kaizen-input-field"
          value={title}
          maxLength={300}
          placeholder="New conversation"
          onChange={event => setTitle(event.target.value)}
        />
      </label>
      <label className="jp-Kaizen-check">
        <input type="checkbox" checked={shared} onChange={event => setShared(event.target.checked)} />
        <span>Shared with other members</span>
      </label>
      <button
        type="submit"
        className="jp-Button jp-mod-styled jp-mod-accept jp-Kaizen-newChatButton"
        disabled={!agentId || busy}
      >
        New chat
      </button>
      {!loading && !agents.length && <p className="jp-Kaizen-empty">No agents are available to you yet.</p>}
    </form>
  );
}
