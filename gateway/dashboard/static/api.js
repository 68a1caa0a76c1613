// The API client the pages share: the same public routes and Bearer token a client uses, so
// the dashboard shows what a client would see. Errors come back in Cloudflare's envelope
// ({"success": false, "errors": [{"code", "message"}]}); ApiError turns that into a sentence.

export class ApiError extends Error {
  constructor(status, errors, fallback) {
    const text = (errors || [])
      .map((e) => (e.code ? `${e.message} (code ${e.code})` : e.message))
      .filter(Boolean)
      .join('; ');
    super(text || fallback || `HTTP ${status}`);
    this.name = 'ApiError';
    this.status = status;
    this.errors = errors || [];
  }
}

// Read an error answer whatever its shape: the envelope, a bare {"error": ...} or text.
export async function errorFrom(response) {
  const fallback = `HTTP ${response.status} ${response.statusText}`.trim();
  let body = null;
  try {
    body = await response.text();
    const data = JSON.parse(body);
    if (Array.isArray(data.errors) && data.errors.length) {
      return new ApiError(response.status, data.errors, fallback);
    }
    const message = data.error?.message || data.error || data.message;
    if (message) return new ApiError(response.status, [{message: String(message)}], fallback);
  } catch {
    if (body) return new ApiError(response.status, [{message: body.slice(0, 300)}], fallback);
  }
  return new ApiError(response.status, [], fallback);
}

function query(params) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== '') q.set(key, String(value));
  }
  const text = q.toString();
  return text ? `?${text}` : '';
}

// session: {account_id, token}. onUnauthorized(err) lets the app go back to its sign-in form
// when the token stops working (revoked, or the gateway was started on a fresh database).
export function createClient(session, {onUnauthorized} = {}) {
  const base = `/client/v4/accounts/${encodeURIComponent(session.account_id)}`;

  async function raw(path, {method = 'GET', params, body, headers = {}, signal} = {}) {
    const init = {method, signal, headers: {Authorization: `Bearer ${session.token}`, ...headers}};
    if (body !== undefined) {
      init.body = typeof body === 'string' ? body : JSON.stringify(body);
      init.headers['Content-Type'] = 'application/json';
    }
    let response;
    try {
      response = await fetch(`${base}/${path}${query(params)}`, init);
    } catch (err) {
      if (err.name === 'AbortError') throw err;
      throw new ApiError(0, [{message: 'Could not reach the gateway (is it still running?)'}]);
    }
    if (!response.ok) {
      const err = await errorFrom(response);
      if (response.status === 401 && onUnauthorized) onUnauthorized(err);
      throw err;
    }
    return response;
  }

  // The envelope's result (and result_info, for lists that page).
  async function call(path, options) {
    const response = await raw(path, options);
    const data = await response.json();
    if (data && data.success === false) throw new ApiError(response.status, data.errors);
    return data && 'result' in data ? {result: data.result, info: data.result_info} : {result: data};
  }

  return {
    session,
    raw,
    async get(path, params) {
      return (await call(path, {params})).result;
    },
    async list(path, params) {
      return call(path, {params});
    },
    async post(path, body, headers) {
      return (await call(path, {method: 'POST', body, headers})).result;
    },
    async put(path, body) {
      return (await call(path, {method: 'PUT', body})).result;
    },
    async del(path) {
      return (await call(path, {method: 'DELETE'})).result;
    },
  };
}

// Split an SSE byte stream into the JSON of its `data:` lines, stopping at [DONE]. Events
// may arrive split across chunks, so lines are buffered until their newline arrives.
export async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 1);
        if (!line.startsWith('data:')) continue;
        const payload = line.slice(5).trim();
        if (payload === '[DONE]') {
          // Read on to the end of the body (the server closes it right after [DONE]):
          // cancelling it before then aborts the request (net::ERR_ABORTED in the network log).
          while (!(await reader.read()).done) { /* nothing after [DONE] */ }
          return;
        }
        yield JSON.parse(payload);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
