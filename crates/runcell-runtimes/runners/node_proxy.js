// runcell: network by permission for Node. Node's http, https and fetch ignore HTTP_PROXY and
// HTTPS_PROXY (before Node 24), and the sandbox has no route of its own: this module,
// preloaded with `--require` (NODE_OPTIONS), sends their connections through runcell's egress
// proxy in CONNECT tunnels. A refused destination fails with the proxy's reason, which names
// the destination and why. Connections to the sandbox's own loopback go direct.
'use strict';
(() => {
  const net = require('net');
  const tls = require('tls');
  const http = require('http');
  const https = require('https');

  const proxy = new URL(process.env.HTTPS_PROXY || process.env.HTTP_PROXY || 'http://127.0.0.1:3128');
  const PROXY_HOST = proxy.hostname;
  const PROXY_PORT = Number(proxy.port || 80);
  const LOCAL = new Set(['localhost', '127.0.0.1', '::1', '[::1]']);
  const isLocal = (host) => LOCAL.has(String(host).toLowerCase());
  const bare = (host) => String(host).replace(/^\[(.*)\]$/, '$1');

  // A CONNECT tunnel to host:port: callback(err, socket), the socket past the proxy's answer.
  function tunnel(host, port, callback) {
    const sock = net.connect(PROXY_PORT, PROXY_HOST);
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (err, s) => {
      if (done) return;
      done = true;
      sock.removeListener('data', onData);
      sock.removeListener('error', finish);
      callback(err, s);
    };
    const onData = (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) {
        if (buf.length > 65536) {
          sock.destroy();
          finish(new Error("runcell's proxy sent an answer too long"));
        }
        return;
      }
      const line = buf.subarray(0, end).toString('latin1').split('\r\n')[0];
      const m = /^HTTP\/1\.\d (\d{3}) ?(.*)$/.exec(line);
      if (!m || m[1] !== '200') {
        sock.destroy();
        const err = new Error(`${m ? m[2] : line} (${host}:${port}, through runcell's egress proxy)`);
        err.code = m && m[1] === '403' ? 'ERUNCELL_REFUSED' : 'ERUNCELL_PROXY';
        return finish(err);
      }
      const rest = buf.subarray(end + 4);
      if (rest.length) sock.unshift(rest);
      finish(null, sock);
    };
    sock.on('data', onData);
    sock.once('error', finish);
    const h = bare(host);
    const authority = `${net.isIPv6(h) ? `[${h}]` : h}:${port}`;
    sock.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  }

  // http and https: every Agent (the global ones and any the program makes) opens its
  // connections through a tunnel. An Agent may create its socket asynchronously.
  function patch(proto, secure) {
    const original = proto.createConnection;
    proto.createConnection = function createConnection(options, oncreate) {
      const host = options.host || options.hostname || 'localhost';
      if (isLocal(host) || options.socketPath) return original.call(this, options, oncreate);
      const port = Number(options.port) || (secure ? 443 : 80);
      tunnel(host, port, (err, sock) => {
        if (err) return oncreate(err);
        if (!secure) return oncreate(null, sock);
        const servername = options.servername || (net.isIP(bare(host)) ? undefined : bare(host));
        // host: the name (or address) the certificate must be for; the socket is the tunnel.
        oncreate(null, tls.connect({ ...options, host: bare(host), port: undefined, path: undefined, socket: sock, servername }));
      });
      return undefined;
    };
  }
  patch(http.Agent.prototype, false);
  patch(https.Agent.prototype, true);

  // fetch (undici, inside Node): a dispatcher of undici's own Agent class whose connector
  // tunnels. Node loads undici at the first call of fetch, which installs its global
  // dispatcher: a data: URL makes that call without touching the network.
  try {
    globalThis.fetch('data:,').catch(() => {});
    const key = Symbol.for('undici.globalDispatcher.1');
    const current = globalThis[key];
    if (current && typeof current.constructor === 'function') {
      const Agent = current.constructor;
      globalThis[key] = new Agent({
        connect(opts, callback) {
          const host = opts.hostname;
          const secure = opts.protocol === 'https:';
          const port = Number(opts.port) || (secure ? 443 : 80);
          const upgrade = (sock) => {
            if (!secure) return callback(null, sock);
            const servername = opts.servername || (net.isIP(bare(host)) ? undefined : bare(host));
            const t = tls.connect({ socket: sock, host: bare(host), servername, ALPNProtocols: ['http/1.1'] });
            t.once('secureConnect', () => callback(null, t));
            t.once('error', (e) => callback(e));
          };
          if (isLocal(host)) {
            const s = net.connect(port, bare(host));
            s.once('connect', () => upgrade(s));
            s.once('error', (e) => callback(e));
            return;
          }
          tunnel(host, port, (err, sock) => (err ? callback(err) : upgrade(sock)));
        },
      });
    }
  } catch (_) {
    // fetch stays as it is: without a route it fails, as any connection that bypasses the
    // proxy does.
  }
})();
