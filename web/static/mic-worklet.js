// Microphone capture: mixes to mono and posts PCM16 LE frames of `frameMs` at the context's own rate (the global
// `sampleRate`, announced to the server in `hello`) to the main thread, which sends them as binary WebSocket
// messages. No resampling here: the server does it with a band-limited filter (soxr), which a worklet cannot match
// cheaply (a box filter loses about 3.5 dB at 8 kHz and aliases above it).

class MicCaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.frameSamples = Math.round((sampleRate * (opts.frameMs || 20)) / 1000);
    this.frame = new Int16Array(this.frameSamples);
    this.filled = 0;
    this.running = true;
    this.port.onmessage = (event) => {
      if (event.data === "stop") this.running = false;
    };
  }

  emit(sample) {
    const clamped = Math.max(-1, Math.min(1, sample));
    this.frame[this.filled++] = clamped < 0 ? clamped * 0x8000 : clamped * 0x7fff;
    if (this.filled === this.frameSamples) {
      const out = this.frame;
      this.port.postMessage(out.buffer, [out.buffer]);
      this.frame = new Int16Array(this.frameSamples);
      this.filled = 0;
    }
  }

  process(inputs) {
    if (!this.running) return false;
    const input = inputs[0];
    if (!input || input.length === 0 || input[0].length === 0) return true;
    const channels = input.length;
    const n = input[0].length;
    for (let i = 0; i < n; i++) {
      let x = 0;
      for (let c = 0; c < channels; c++) x += input[c][i];
      this.emit(x / channels);
    }
    return true;
  }
}

registerProcessor("mic-capture", MicCaptureProcessor);
