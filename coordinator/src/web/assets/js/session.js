// Who is signed in and what the coordinator lets them do, as `/api/session` said. The pages ask
// it only to hide what the coordinator would refuse anyway: it decides every call itself.

export class Session {
  constructor(data) {
    const { principal, roles = [], trace_url: traceUrl } = data ?? {};
    this.principal = principal;
    this.roles = roles;
    // A link to a run's trace, `{trace_id}` standing for its id; none when not configured.
    this.traceUrl = traceUrl;
  }

  can(role) {
    return Boolean(this.roles?.includes(role));
  }

  // Cancel and retry: an operator's on any run, a submitter's on its own (the coordinator
  // decides; this only hides what it would refuse). Without authentication there is no
  // principal and nothing is anyone's.
  mayChange(record) {
    if (this.can('operate')) return true;
    const principal = this.principal;
    return this.can('submit') && (!principal || record.submitted_by === principal);
  }
}
