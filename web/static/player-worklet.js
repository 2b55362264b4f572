// Gapless playback of the assistant's PCM: chunks are queued and read as one continuous stream, resampled from the
// announced source rate to the context rate by linear interpolation. A "clear" message empties the queue at once
// (barge-in); "pause" plays silence and keeps the queue (a sound that may be a barge-in), "resume" plays on. Played source samples are counted and reported, in total and per turn (each chunk carries its turn), so
// the page can tell the server exactly how much of an answer the user heard.

class PcmPlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.setRate(opts.sourceRate || 22050);
    this.queue = [];
    this.chunk = null;
    this.index = 0;
    this.a = 0; // interpolation interval [a, b], phase in [0, 1)
    this.b = 0;
    this.phase = 0;
    this.played = 0;
    this.turn = null; // the turn whose audio is playing now
    this.turnPlayed = 0; // source samples of that turn played so far
    this.buffered = 0;
    this.playing = false;
    this.paused = false;
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  setRate(rate) {
    this.sourceRate = rate;
    this.step = rate / sampleRate;
  }

  onMessage(msg) {
    if (msg.type === "pcm") {
      msg.samples.turn = msg.turn;
      this.queue.push(msg.samples);
      this.buffered += msg.samples.length;
    } else if (msg.type === "pause" || msg.type === "resume") {
      this.paused = msg.type === "pause";
    } else if (msg.type === "clear") {
      this.paused = false;
      this.queue = [];
      this.chunk = null;
      this.buffered = 0;
      this.a = this.b = this.phase = 0;
      if (this.playing) {
        this.playing = false;
        this.port.postMessage({ type: "drained", played: this.played, cleared: true, ...this.turnReport() });
      }
    } else if (msg.type === "rate") {
      this.setRate(msg.rate);
    }
  }

  turnReport() {
    return { turn: this.turn, turnPlayed: this.turnPlayed };
  }

  nextSample() {
    while (!this.chunk || this.index >= this.chunk.length) {
      if (this.queue.length === 0) return null;
      this.chunk = this.queue.shift();
      this.index = 0;
      if (this.chunk.turn !== this.turn) {
        this.turn = this.chunk.turn;
        this.turnPlayed = 0;
      }
    }
    this.turnPlayed++;
    this.buffered--;
    this.played++;
    return this.chunk[this.index++];
  }

  process(_inputs, outputs) {
    const out = outputs[0];
    const n = out[0].length;
    let produced = false;
    for (let i = 0; i < n && this.paused; i++) out[0][i] = 0;
    for (let i = 0; i < n && !this.paused; i++) {
      let starved = false;
      while (this.phase >= 1) {
        const s = this.nextSample();
        if (s === null) {
          starved = true;
          break;
        }
        this.a = this.b;
        this.b = s;
        this.phase -= 1;
      }
      if (starved) {
        out[0][i] = 0;
        continue;
      }
      out[0][i] = this.a + (this.b - this.a) * this.phase;
      this.phase += this.step;
      produced = true;
    }
    for (let c = 1; c < out.length; c++) out[c].set(out[0]);
    if (produced && !this.playing) this.playing = true;
    if (this.playing && this.buffered <= 0 && this.queue.length === 0 && (!this.chunk || this.index >= this.chunk.length)) {
      this.playing = false;
      this.port.postMessage({ type: "drained", played: this.played, cleared: false, ...this.turnReport() });
    }
    this.sinceReport += n;
    if (this.sinceReport >= sampleRate / 10) {
      this.sinceReport = 0;
      this.port.postMessage({ type: "played", played: this.played, buffered: this.buffered, ...this.turnReport() });
    }
    return true;
  }
}

registerProcessor("pcm-player", PcmPlayerProcessor);
