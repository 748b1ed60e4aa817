// The caller's OpenTelemetry trace into memsvc: a Connect interceptor that sends the active
// context with every call (W3C `traceparent` and `tracestate`, written by the propagator
// the application registered, as the OpenTelemetry SDK does), so memsvc's span of the call
// is a child of the caller's. For createGrpcTransport and createConnectTransport alike:
//
//   createGrpcTransport({ baseUrl, interceptors: [traceContext()] })
//
// Without a registered SDK the API is a no-op and nothing is sent.
import type { Interceptor } from "@connectrpc/connect";
import { context, propagation } from "@opentelemetry/api";

export function traceContext(): Interceptor {
  return (next) => async (req) => {
    propagation.inject(context.active(), req.header, {
      set: (headers, key, value) => headers.set(key, value),
    });
    return next(req);
  };
}
