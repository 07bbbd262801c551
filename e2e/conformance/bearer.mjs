// Loaded with `node --import`: adds "Authorization: Bearer $VMGATE_CONFORMANCE_TOKEN"
// to every HTTP request the conformance suite sends to $VMGATE_CONFORMANCE_URL's
// origin, whether through fetch (the MCP SDK's transport) or undici's request
// (dns-rebinding-protection): both go through undici's global dispatcher.
import { getGlobalDispatcher, setGlobalDispatcher } from 'undici';

const origin = new URL(process.env.VMGATE_CONFORMANCE_URL).origin;
const authorization = `Bearer ${process.env.VMGATE_CONFORMANCE_TOKEN}`;
const withAuth = (h) => (Array.isArray(h) ? [...h, 'authorization', authorization] : { ...h, authorization });
setGlobalDispatcher(getGlobalDispatcher().compose((dispatch) => (opts, handler) =>
  dispatch(new URL(opts.origin).origin === origin ? { ...opts, headers: withAuth(opts.headers) } : opts, handler)));
