// The coordinator's JSON API as the pages call it: the bearer token kept for this tab, a call
// that turns every failure into an ApiError, and the words a failure is shown with.

const TOKEN_KEY = 'baton.token';

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

export function setToken(value) {
  try {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage refused (private mode): the token lives as long as the page.
  }
}

// Told of every 401 with the reason to show (empty when no token was sent): the app asks for one.
let unauthorized = () => {};

/** Who is told when the coordinator refuses the token (or asks for one). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

/** Calls the API; a 401 anywhere calls the onUnauthorized handler (and still throws). */
export async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'same-origin',
    });
  } catch (error) {
    throw new ApiError(0, `cannot reach the coordinator (${error.message})`, 'unavailable');
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (response.status === 401) {
    const message = data?.error || 'the coordinator asks for a token';
    unauthorized(bearer ? `The token was refused: ${message}.` : '');
    throw new ApiError(401, message, 'unauthenticated');
  }
  if (!response.ok) {
    const message = data?.error || `${response.status} ${response.statusText}`.trim();
    throw new ApiError(response.status, message, data?.code || '');
  }
  return data;
}

export function errorText(error) {
  if (error?.status === 403) return `Not allowed: ${error.message}`;
  return error?.message || String(error);
}

export function apiRunPath(runId) {
  return `/api/runs/${encodeURIComponent(runId)}`;
}
