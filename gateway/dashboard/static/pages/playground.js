// Playground: chat with a text-generation model, streamed (POST ai/run/{model} with
// stream: true, read as SSE from fetch's ReadableStream), or embed lines of text with an
// embedding model. Shows the node that answered and the decode speed.

import {ApiError, sseEvents} from '../api.js';
import {errorBox, fmt, h, pageHead, replace} from '../dom.js';

const GENERATION = 'Text Generation';
const EMBEDDINGS = 'Text Embeddings';

const propsOf = (m) => Object.fromEntries((m.properties || []).map((p) => [p.property_id, p.value]));

function stat(label, testid) {
  const value = h('strong', {'data-testid': testid}, '–');
  return {value, el: h('span', {}, `${label} `, value)};
}

function bubble(role, text = '') {
  const body = h('span', {class: 'text'}, text);
  const el = h('div', {class: `msg msg-${role}`, 'data-role': role},
    h('span', {class: 'who'}, role === 'user' ? 'You' : role === 'assistant' ? 'Model' : 'Error'), body);
  return {el, body};
}

export function mount(section, {api}) {
  const error = errorBox();
  const model = h('select', {id: 'pg-model', 'data-testid': 'pg-model'});
  const maxTokens = h('input', {id: 'pg-max-tokens', type: 'number', min: '1', max: '2048', value: '128'});
  const temperature = h('input', {id: 'pg-temperature', type: 'number', min: '0', max: '2', step: '0.1', value: '0.7'});
  const input = h('textarea', {id: 'pg-input', 'data-testid': 'pg-input', rows: '3',
                               'aria-describedby': 'pg-input-hint'});
  const hint = h('span', {class: 'muted small', id: 'pg-input-hint'});
  const send = h('button', {type: 'submit', class: 'btn btn-primary', 'data-testid': 'pg-send'}, 'Send');
  const stopButton = h('button', {type: 'button', class: 'btn', 'data-testid': 'pg-stop', disabled: true}, 'Stop');
  const clear = h('button', {type: 'button', class: 'btn btn-quiet', 'data-testid': 'pg-clear'}, 'Clear');
  // aria-busy while streaming: a screen reader reads the answer once, not token by token.
  const output = h('div', {class: 'chat', 'data-testid': 'pg-output', 'aria-live': 'polite',
                           'aria-busy': 'false', 'aria-label': 'Conversation', tabindex: '0'});
  const node = stat('Node', 'pg-node');
  const tps = stat('Tokens/s', 'pg-tps');
  const ttft = stat('First token', 'pg-ttft');
  const tokens = stat('Tokens', 'pg-tokens');
  const standIn = stat('Stand-in', 'pg-stand-in');
  const shape = stat('Shape', 'pg-shape');
  standIn.el.hidden = true;
  // A miniature answers for a model too big for this machine: its header says what is synthetic.
  const miniature = h('p', {class: 'small muted', 'data-testid': 'pg-miniature', hidden: true});
  const form = h('form', {class: 'card', style: 'display:grid;gap:.6rem'},
    h('div', {class: 'row', style: 'justify-content:space-between'},
      h('h2', {}, 'Conversation'), h('div', {class: 'meta', role: 'status'},
        node.el, tps.el, ttft.el, tokens.el, shape.el, standIn.el)),
    miniature,
    output,
    h('label', {for: 'pg-input'}, 'Message'), input, hint,
    h('div', {class: 'row'}, send, stopButton, clear));
  section.append(
    pageHead('playground', 'Playground', 'Talk to a model through the public API, streamed.'),
    error.el,
    h('div', {class: 'split', style: 'grid-template-columns:minmax(240px,300px) minmax(0,1fr)'},
      h('section', {class: 'card', style: 'display:grid;gap:.6rem', 'aria-label': 'Model settings'},
        h('div', {class: 'field'}, h('label', {for: 'pg-model'}, 'Model'), model),
        h('div', {class: 'field'}, h('label', {for: 'pg-max-tokens'}, 'Max tokens'), maxTokens),
        h('div', {class: 'field'}, h('label', {for: 'pg-temperature'}, 'Temperature'), temperature),
        h('p', {class: 'muted small'}, 'A planning-only model is answered by the stand-in model; the answer says so.')),
      form));

  let models = [];
  let messages = [];
  let controller = null;
  const current = () => models.find((m) => m.name === model.value);
  const isEmbedding = () => current()?.task?.name === EMBEDDINGS;

  function setMode() {
    const embed = isEmbedding();
    hint.textContent = embed ? 'One text per line; Enter embeds them.'
      : 'Enter sends, Shift+Enter starts a new line.';
    shape.el.hidden = !embed;
    for (const s of [tps, ttft, tokens]) s.el.hidden = embed;
    maxTokens.disabled = temperature.disabled = embed;
  }

  function busy(on) {
    send.disabled = on;
    stopButton.disabled = !on;
    output.setAttribute('aria-busy', String(on));
  }

  function showHeaders(response) {
    node.value.textContent = response.headers.get('x-edgefire-node') || '–';
    const standing = response.headers.get('x-edgefire-stand-in');
    standIn.value.textContent = standing || '–';
    standIn.el.hidden = !standing;
    const small = response.headers.get('x-edgefire-miniature');
    miniature.textContent = small ? `Answered by a ${small}` : '';
    miniature.hidden = !small;
  }

  async function chat(text) {
    messages.push({role: 'user', content: text});
    output.append(bubble('user', text).el);
    const answer = bubble('assistant');
    output.append(answer.el);
    output.scrollTop = output.scrollHeight;
    const started = performance.now();
    let first = null;
    let last = null;
    let count = 0;
    controller = new AbortController();
    try {
      const response = await api.raw(`ai/run/${model.value}`, {method: 'POST', signal: controller.signal,
        body: {messages, stream: true, max_tokens: Number(maxTokens.value) || 128,
               temperature: Number(temperature.value)}});
      showHeaders(response);
      for await (const event of sseEvents(response)) {
        if (event.errors?.length) throw new ApiError(200, event.errors);
        if (event.response) {
          const now = performance.now();
          first ??= now;
          last = now;
          count += 1;
          answer.body.textContent += event.response;
          output.scrollTop = output.scrollHeight;
        }
        if (event.usage?.completion_tokens != null) count = event.usage.completion_tokens;
        // Decode speed: tokens after the first over the time since the first arrived.
        ttft.value.textContent = first === null ? '–' : fmt.ms(first - started);
        tokens.value.textContent = String(count);
        tps.value.textContent = count > 1 && last > first ? fmt.num((count - 1) / ((last - first) / 1000), 1) : '–';
      }
      messages.push({role: 'assistant', content: answer.body.textContent});
    } catch (err) {
      if (err.name === 'AbortError') {
        answer.body.append(h('em', {class: 'muted'}, ' (stopped)'));
        messages.push({role: 'assistant', content: answer.body.textContent});
      } else {
        messages.pop(); // the failed turn is not part of the conversation
        answer.el.replaceWith(bubble('error', err.message).el);
      }
    }
  }

  async function embed(text) {
    const lines = text.split('\n').map((l) => l.trim()).filter(Boolean);
    output.append(bubble('user', lines.join('\n')).el);
    controller = new AbortController();
    try {
      const response = await api.raw(`ai/run/${model.value}`, {method: 'POST', body: {text: lines},
                                                               signal: controller.signal});
      showHeaders(response);
      const {result} = await response.json();
      shape.value.textContent = JSON.stringify(result.shape);
      shape.value.setAttribute('data-shape', JSON.stringify(result.shape));
      const preview = (result.data || []).map((vector, i) =>
        `${i + 1}: [${vector.slice(0, 6).map((v) => v.toFixed(4)).join(', ')}, …] (${vector.length} values)`);
      output.append(bubble('assistant', `shape ${JSON.stringify(result.shape)}\n${preview.join('\n')}`).el);
    } catch (err) {
      if (err.name !== 'AbortError') output.append(bubble('error', err.message).el);
    }
    output.scrollTop = output.scrollHeight;
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const text = input.value.trim();
    if (!text || controller) return;
    input.value = '';
    busy(true);
    try {
      await (isEmbedding() ? embed(text) : chat(text));
    } finally {
      controller = null;
      busy(false);
      input.focus();
    }
  });
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  stopButton.addEventListener('click', () => controller?.abort());
  clear.addEventListener('click', () => {
    messages = [];
    replace(output);
  });
  model.addEventListener('change', () => {
    messages = []; // a conversation belongs to the model it was held with
    replace(output);
    setMode();
  });

  api.get('ai/models/search', {per_page: 100}).then((list) => {
    models = list.filter((m) => [GENERATION, EMBEDDINGS].includes(m.task?.name));
    const option = (m) => {
      const planning = propsOf(m).planning_only === 'true';
      // Stand-ins answer text generation only: a planning-only embedding model cannot run.
      const runs = !planning || m.task.name === GENERATION;
      return h('option', {value: m.name, disabled: !runs},
        m.name, planning ? (runs ? ' (stand-in answers)' : ' (planning only)') : '');
    };
    replace(model, [GENERATION, EMBEDDINGS].map((task) => h('optgroup', {label: task},
      models.filter((m) => m.task.name === task).map(option))));
    setMode();
  }).catch((err) => error.show(err));
  setMode();
  return () => controller?.abort();
}
