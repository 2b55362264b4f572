// Microphone capture: mixes to mono, resamples from the context rate to 16 kHz and posts PCM16 LE frames of
// `frameMs` (20 ms = 320 samples) to the main thread, which sends them on the WebSocket as binary messages.
// Resampling: a box filter as wide as the decimation ratio (cheap anti-aliasing), then linear interpolation.

class MicCaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.targetRate = opts.targetRate || 16000;
    this.frameSamples = Math.round((this.targetRate * (opts.frameMs || 20)) / 1000);
    this.step = sampleRate / this.targetRate; // input samples per output sample
    this.boxWidth = Math.max(1, Math.round(this.step));
    this.history = new Float32Array(this.boxWidth); // ring for the box filter
    this.historyIndex = 0;
    this.historySum = 0;
    this.prev = 0; // last filtered input sample, left end of the interpolation interval
    this.phase = 0; // position of the next output sample after `prev`, in input samples
    this.frame = new Int16Array(this.frameSamples);
    this.filled = 0;
    this.running = true;
    this.port.onmessage = (event) => {
      if (event.data === "stop") this.running = false;
    };
  }

  filter(x) {
    this.historySum += x - this.history[this.historyIndex];
    this.history[this.historyIndex] = x;
    this.historyIndex = (this.historyIndex + 1) % this.boxWidth;
    return this.historySum / this.boxWidth;
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
      const current = this.filter(x / channels);
      // Output samples that fall between prev (position 0) and current (position 1).
      while (this.phase < 1) {
        this.emit(this.prev + (current - this.prev) * this.phase);
        this.phase += this.step;
      }
      this.phase -= 1;
      this.prev = current;
    }
    return true;
  }
}

registerProcessor("mic-capture", MicCaptureProcessor);
