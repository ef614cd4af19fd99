import React, { useEffect, useState } from 'react';

import { formatDuration } from '../journal';

/** A ticking "elapsed since" label (e.g. a running tool call). */
export function Elapsed({ since }: { since: string }): JSX.Element {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 250);
    return () => clearInterval(timer);
  }, []);
  const start = Date.parse(since);
  const ms = Number.isFinite(start) ? Math.max(0, now - start) : 0;
  return <span className="jp-Kaizen-elapsed">{formatDuration(ms)}</span>;
}

/** A small CSS spinner, hidden from assistive technology (the text says "running"). */
export function Spinner(): JSX.Element {
  return <span className="jp-Kaizen-spinner" aria-hidden="true" />;
}
