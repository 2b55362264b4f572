// Browser client for protocol v1 (web/PROTOCOL.md): microphone -> WebSocket -> live transcript, refining answer,
// gapless audio. No build step, no dependencies.

const DEFAULT_INPUT_RATE = 16000; // what the server assumes until a hello says otherwise
const FRAME_MS = 20;
const MAX_BACKOFF_MS = 10000;
// Policy closes (flood, frame too large): reconnecting would only repeat what got the socket closed.
const NO_RECONNECT_CODES = new Set([1008, 1009]);
const GOING_AWAY = 1001; // the server drains (web/PROTOCOL.md): reconnect at once, the page says why

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  error: $("error"),
  hint: $("hint"),
  turns: $("turns"),
  liveUser: $("live-user"),
  liveAnswer: $("live-answer"),
  form: $("typed"),
  text: $("text"),
  send: $("send"),
  start: $("start"),
};

const app = {
  ws: null,
  ready: false,
  attempts: 0,
  reconnectTimer: null,
  goingAwayMessage: null, // the `going_away` error's text, shown when its 1001 close arrives
  outputRate: 22050,
  audioContext: null,
  player: null,
  mic: null, // { stream, source, node }
  serverSpeaking: false,
  playerBusy: false,
  thinking: false,
  pendingTyped: null,
  assistantByTurn: new Map(),
  lastDraft: null, // { turn, committed, draft }: what an interrupted answer had reached
  audioTurn: null, // the turn of the speech arriving now (from audio_start)
  reportedAt: 0, // when the last `played` report went out (performance.now ms) ...
  reportedPlayed: -1, // ... and what it said
};

window.__playedSamples = 0;
window.__receivedAudioBytes = 0;
window.__state = "connecting";

// --- connection state --------------------------------------------------------------------------------------------
function setState(state, detail) {
  window.__state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = detail ? `${state}: ${detail}` : state;
}

function refreshState() {
  if (!app.ready) return;
  if (app.serverSpeaking || app.playerBusy) setState("speaking");
  else if (app.thinking) setState("thinking");
  else if (app.mic) setState("listening");
  else setState("ready");
}

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = false;
}

function clearError() {
  ui.error.hidden = true;
  ui.error.textContent = "";
}

// The access token, if the server wants one, travels in an HttpOnly cookie that the server set when the page was
// first opened as /?token=...; the browser adds it to the handshake, so this script never sees it.
function socketUrl() {
  const url = new URL("ws", window.location.href);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}

function inputRate() {
  return app.mic ? Math.round(app.audioContext.sampleRate) : DEFAULT_INPUT_RATE;
}

function sendHello() {
  window.__inputRate = inputRate();
  // the browser's own canceller (getUserMedia echoCancellation) takes the assistant's voice out of the microphone,
  // with the true playback timing: the server's canceller (echo_cancellation "server") is for clients without one
  send(JSON.stringify({ type: "hello", sample_rate: inputRate(), protocol: 1, echo_cancellation: "client" }));
}

function connect() {
  clearTimeout(app.reconnectTimer);
  setState(app.attempts === 0 ? "connecting" : "reconnecting");
  const ws = new WebSocket(socketUrl());
  ws.binaryType = "arraybuffer";
  app.ws = ws;
  ws.onopen = sendHello;
  ws.onmessage = (event) => {
    if (typeof event.data === "string") onServerMessage(JSON.parse(event.data));
    else onAudio(event.data);
  };
  ws.onclose = (event) => {
    if (app.ws !== ws) return;
    app.ready = false;
    app.ws = null;
    ui.send.disabled = true;
    app.serverSpeaking = false;
    app.thinking = false;
    window.__closeCode = event.code;
    if (event.reason) showError(`connection closed (${event.code}): ${event.reason}`);
    if (event.code === GOING_AWAY) {
      // A drain (deploy, restart): behind a balancer another worker takes the next session at once.
      showError(`${app.goingAwayMessage || "the server went away"}; reconnecting`);
      app.goingAwayMessage = null;
      app.attempts = 0;
    }
    if (NO_RECONNECT_CODES.has(event.code)) {
      if (app.mic) stopMic();
      ui.start.disabled = true;
      setState("closed", event.reason || `code ${event.code}`);
      return; // reload the page to start again
    }
    scheduleReconnect();
  };
}

function scheduleReconnect() {
  // the first retry comes soon (a drained worker's sessions move to another); later ones back off, with jitter
  const delay = Math.min(MAX_BACKOFF_MS, 250 * 2 ** app.attempts) * (0.75 + Math.random() * 0.5);
  app.attempts += 1;
  setState("reconnecting", `retry in ${(delay / 1000).toFixed(1)} s`);
  app.reconnectTimer = setTimeout(connect, delay);
}

function send(message) {
  if (app.ws && app.ws.readyState === WebSocket.OPEN) app.ws.send(message);
}

// --- server messages ---------------------------------------------------------------------------------------------
function onServerMessage(msg) {
  switch (msg.type) {
    case "ready":
      app.ready = true;
      app.attempts = 0;
      app.outputRate = msg.sample_rate;
      if (app.player) app.player.port.postMessage({ type: "rate", rate: msg.sample_rate });
      ui.send.disabled = false;
      ui.start.disabled = false;
      clearError();
      refreshState();
      break;
    case "vad":
      if (msg.state === "speech_start") {
        // Speech during playback is the server's to judge: `pause` now, then `clear` (words: a barge-in) or
        // `resume` (a cough, the assistant's own echo); its turn lasts as long as this page reports playing.
        ui.liveUser.hidden = false;
      } else {
        app.thinking = true;
      }
      refreshState();
      break;
    case "transcript":
      onTranscript(msg);
      break;
    case "draft":
      app.thinking = true;
      renderDraft(msg);
      refreshState();
      break;
    case "answer":
      finishAnswer(msg.turn, msg.text);
      break;
    case "audio_start":
      app.serverSpeaking = true;
      app.audioTurn = msg.turn;
      if (msg.sample_rate && app.player) app.player.port.postMessage({ type: "rate", rate: msg.sample_rate });
      refreshState();
      break;
    case "audio_end":
      app.serverSpeaking = false;
      refreshState();
      break;
    case "pause":
    case "resume":
      if (app.player) app.player.port.postMessage({ type: msg.type });
      break;
    case "clear":
      if (app.player) app.player.port.postMessage({ type: "clear" });
      app.serverSpeaking = false;
      app.playerBusy = false;
      refreshState();
      break;
    case "turn_end":
      onTurnEnd(msg);
      break;
    case "error":
      if (msg.code === "going_away") app.goingAwayMessage = msg.message;
      showError(`${msg.code}: ${msg.message}`);
      setState("error", msg.code);
      if (msg.turn !== undefined) app.thinking = false;
      setTimeout(refreshState, 2500);
      break;
    default:
      break;
  }
}

function onTranscript(msg) {
  if (!msg.final) {
    ui.liveUser.hidden = false;
    ui.liveUser.replaceChildren(
      document.createTextNode(msg.committed),
      Object.assign(document.createElement("span"), {
        className: "transcript-pending",
        textContent: msg.text.slice(msg.committed.length),
      }),
    );
    return;
  }
  ui.liveUser.hidden = true;
  ui.liveUser.textContent = "";
  const text = msg.text.trim();
  if (app.pendingTyped !== null && text === app.pendingTyped) {
    app.pendingTyped = null; // already shown when it was typed
  } else if (text) {
    addUserTurn(text);
  }
  app.thinking = Boolean(text);
  refreshState();
}

function addUserTurn(text) {
  ui.hint.hidden = true;
  const item = document.createElement("li");
  item.className = "bubble user user-turn";
  item.textContent = text;
  ui.turns.append(item);
  item.scrollIntoView({ block: "end" });
}

function renderDraft(msg) {
  app.lastDraft = { turn: msg.turn, committed: msg.committed, draft: msg.draft };
  ui.liveAnswer.hidden = false;
  const pieces = msg.pieces && msg.pieces.length ? msg.pieces : [[msg.committed, true], [msg.draft.slice(msg.committed.length), false]];
  const spans = pieces.map(([text, committed]) =>
    Object.assign(document.createElement("span"), { className: `piece ${committed ? "c" : "u"}`, textContent: text }),
  );
  const step = Object.assign(document.createElement("span"), { className: "step", textContent: `pass ${msg.step}` });
  ui.liveAnswer.replaceChildren(...spans, step);
  ui.liveAnswer.scrollIntoView({ block: "end" });
}

function assistantTurn(turn) {
  let item = app.assistantByTurn.get(turn);
  if (!item) {
    item = document.createElement("li");
    item.className = "bubble assistant assistant-turn";
    item.dataset.turn = String(turn);
    item.append(Object.assign(document.createElement("div"), { className: "answer-text" }));
    ui.turns.append(item);
    app.assistantByTurn.set(turn, item);
  }
  return item;
}

function finishAnswer(turn, text) {
  ui.liveAnswer.hidden = true;
  ui.liveAnswer.textContent = "";
  const item = assistantTurn(turn);
  item.querySelector(".answer-text").textContent = text;
  item.scrollIntoView({ block: "end" });
  app.thinking = false;
  refreshState();
}

function onTurnEnd(msg) {
  app.thinking = false;
  ui.liveAnswer.hidden = true;
  const drafted = app.lastDraft && app.lastDraft.turn === msg.turn;
  if (!msg.answer && !msg.spoken && !drafted && !app.assistantByTurn.has(msg.turn)) {
    refreshState();
    return; // nothing was answered (empty transcript, cancelled before the model ran)
  }
  const item = assistantTurn(msg.turn);
  const textBox = item.querySelector(".answer-text");
  if (!textBox.textContent) textBox.textContent = msg.answer;
  if (msg.interrupted) {
    item.classList.add("interrupted");
    // Cut before the model finished: `answer` is empty, so show what had been written by then (the last draft).
    const draft = app.lastDraft && app.lastDraft.turn === msg.turn ? app.lastDraft.draft.trim() : "";
    const written = msg.answer || draft;
    if (written && msg.spoken !== written && written.startsWith(msg.spoken)) {
      textBox.replaceChildren(
        document.createTextNode(msg.spoken),
        Object.assign(document.createElement("span"), { className: "unheard", textContent: written.slice(msg.spoken.length) }),
      );
    } else if (!textBox.textContent) {
      textBox.textContent = msg.spoken || written;
    }
  }
  item.querySelector(".latency")?.remove();
  item.append(renderLatency(msg.latency_ms || {}, msg.stats || {}));
  refreshState();
}

function renderLatency(latency, stats) {
  const box = document.createElement("div");
  box.className = "latency";
  const chip = (label, value, cls) => {
    const span = document.createElement("span");
    if (cls) span.className = cls;
    span.textContent = `${label} ${value}`;
    box.append(span);
  };
  const v2v = latency.voice_to_voice;
  if (typeof v2v === "number") chip("voice→voice", `${Math.round(v2v)} ms`, "v2v");
  for (const [name, ms] of Object.entries(latency)) {
    if (name === "voice_to_voice" || name.startsWith("at_")) continue; // at_*: raw offsets, the chips show stages
    chip(name.replaceAll("_", " "), typeof ms === "number" ? `${Math.round(ms)} ms` : "–");
  }
  // The few stats that explain the latency; all of them are in the tooltip.
  const shown = { tokens_per_pass: "tokens/pass", hits: "spec hits", misses: "spec misses", saved_ms: "saved ms" };
  for (const [name, label] of Object.entries(shown)) {
    const value = stats[name];
    if (typeof value === "number") chip(label, Number.isInteger(value) ? value : value.toFixed(2));
  }
  box.title = Object.entries(stats)
    .map(([name, value]) => `${name}: ${value}`)
    .join("\n");
  return box;
}

// --- audio out ---------------------------------------------------------------------------------------------------
async function ensureAudio() {
  if (!app.audioContext) {
    app.audioContext = new AudioContext({ latencyHint: "interactive" });
    await app.audioContext.audioWorklet.addModule("player-worklet.js");
    await app.audioContext.audioWorklet.addModule("mic-worklet.js");
    app.player = new AudioWorkletNode(app.audioContext, "pcm-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { sourceRate: app.outputRate },
    });
    app.player.port.onmessage = (event) => {
      const msg = event.data;
      window.__playedSamples = msg.played;
      reportPlayed(msg);
      if (msg.type === "drained") {
        app.playerBusy = false;
        refreshState();
      }
    };
    app.player.connect(app.audioContext.destination);
  }
  if (app.audioContext.state !== "running") await app.audioContext.resume();
  return app.audioContext;
}

// Tell the server how much of the turn's speech really came out of the speaker: after an interruption the history
// keeps exactly what was heard. Every ~250 ms while playing, and once when playback stops or is cleared.
function reportPlayed(msg) {
  if (msg.turn === null || msg.turn === undefined) return;
  const now = performance.now();
  const final = msg.type === "drained";
  if (!final && (msg.turnPlayed === app.reportedPlayed || now - app.reportedAt < 250)) return;
  app.reportedAt = now;
  app.reportedPlayed = msg.turnPlayed;
  send(JSON.stringify({ type: "played", turn: msg.turn, samples: msg.turnPlayed }));
}

function onAudio(buffer) {
  window.__receivedAudioBytes += buffer.byteLength;
  const pcm = new Int16Array(buffer);
  const samples = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  const deliver = () => {
    app.player.port.postMessage({ type: "pcm", samples, turn: app.audioTurn }, [samples.buffer]);
    app.playerBusy = true;
    refreshState();
  };
  if (app.player) deliver();
  else ensureAudio().then(deliver, (err) => showError(`cannot play audio: ${err.message}`));
}

// --- microphone --------------------------------------------------------------------------------------------------
async function startMic() {
  const ctx = await ensureAudio();
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
  });
  const source = ctx.createMediaStreamSource(stream);
  // The worklet sends the context's own rate (often 48 kHz); the server resamples with a proper filter (soxr).
  const node = new AudioWorkletNode(ctx, "mic-capture", {
    numberOfOutputs: 0,
    processorOptions: { frameMs: FRAME_MS },
  });
  node.port.onmessage = (event) => send(event.data);
  app.mic = { stream, source, node };
  sendHello(); // before the first frame: the server must know the rate of what follows
  source.connect(node);
  ui.start.textContent = "Stop";
  ui.start.setAttribute("aria-pressed", "true");
  refreshState();
}

function stopMic() {
  if (!app.mic) return;
  app.mic.node.port.postMessage("stop");
  app.mic.source.disconnect();
  app.mic.stream.getTracks().forEach((track) => track.stop());
  app.mic = null;
  ui.start.textContent = "Start";
  ui.start.setAttribute("aria-pressed", "false");
  refreshState();
}

ui.start.addEventListener("click", async () => {
  if (app.mic) {
    stopMic();
    return;
  }
  ui.start.disabled = true;
  try {
    await startMic();
  } catch (err) {
    showError(`microphone unavailable: ${err.message}`);
    setState("error", "microphone");
  } finally {
    ui.start.disabled = false;
  }
});

ui.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = ui.text.value.trim();
  if (!text || !app.ready) return;
  ensureAudio().catch((err) => showError(`cannot play audio: ${err.message}`));
  if (app.serverSpeaking || app.playerBusy) {
    send(JSON.stringify({ type: "interrupt" }));
    if (app.player) app.player.port.postMessage({ type: "clear" }); // audio already buffered here stops too
  }
  send(JSON.stringify({ type: "text", text }));
  app.pendingTyped = text;
  addUserTurn(text);
  app.thinking = true;
  ui.text.value = "";
  refreshState();
});

connect();
