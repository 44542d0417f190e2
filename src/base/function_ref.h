// A non-owning reference to a callable: what std::function is for a call that does not outlive
// its argument (a parallel_for body), without std::function's heap allocation for captures larger
// than its small buffer. The referenced callable must outlive the FunctionRef.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace hybridlm {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT: implicit, like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...);
        }) {}
  R operator()(Args... a) const { return call_(object_, std::forward<Args>(a)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace hybridlm
