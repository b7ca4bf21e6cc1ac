// The "Complete Usage Example" of the cai-service WebSocket API (seed 004),
// as written, run against tokenwire by tests/tests/cai_node.rs. Changed from
// the source: the URL (argv[2]), the model (argv[3]: a server answers
// MODEL_NOT_FOUND for a model it does not serve), and the end (the source's
// example runs forever; this one closes after STREAM_COMPLETE and prints one
// JSON summary line that the test checks).
//
// Needs Node 20.10+ run with --experimental-websocket (the global WebSocket
// of browsers), or Node 22+.
const url = process.argv[2];
const model = process.argv[3];
const summary = { started: false, chunks: [], sentences: [], acked: [], complete: null, errors: [] };

const ws = new WebSocket(url);

ws.onopen = () => {
  // Send a completion request
  ws.send(JSON.stringify({
    type: 'COMPLETION',
    requestId: 'req_' + Date.now(),
    payload: {
      prompt: 'Write a haiku about programming',
      model: model,
      options: {
        temperature: 0.8,
        stream: true
      }
    }
  }));
};

ws.onmessage = (event) => {
  const message = JSON.parse(event.data);

  switch (message.type) {
    case 'STREAM_START':
      summary.started = true;
      break;
    case 'CONTENT_CHUNK':
      summary.chunks.push(message.payload.content);
      break;
    case 'SENTENCE_BOUNDARY':
      summary.sentences.push(message.payload.sentence);
      // Acknowledge sentence completion
      ws.send(JSON.stringify({
        type: 'SENTENCE_COMPLETED',
        requestId: message.requestId,
        payload: { sentenceIndex: message.payload.sentenceIndex }
      }));
      summary.acked.push(message.payload.sentenceIndex);
      break;
    case 'STREAM_COMPLETE':
      summary.complete = message.payload;
      ws.close(1000);
      break;
    case 'ERROR':
      summary.errors.push(message.error);
      ws.close(1000);
      break;
  }
};

ws.onclose = (event) => {
  summary.close = event.code;
  console.log(JSON.stringify(summary));
  process.exit(summary.complete ? 0 : 1);
};

ws.onerror = () => {
  summary.errors.push({ code: 'SOCKET', message: 'WebSocket error' });
};
